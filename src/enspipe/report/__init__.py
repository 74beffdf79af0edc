"""From run directories to results: the cell table (``collect``), derived tables, findings
checked against the paper, and figures."""
