"""The networks the members train: registry (``networks``) and their Keras definitions."""
