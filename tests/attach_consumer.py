"""One attached consumer, as a search's trial would be: ``python tests/attach_consumer.py SOCKET
DATA EPOCHS SECONDS_PER_BATCH OUT.json [NAME [torch]]``; writes its epochs' ledger to OUT.json (or,
where the server ends, the error). ``torch``: it iterates ``stream.torch()`` and records where
the tensors were."""
import json
import sys
import time

import enspipe
from enspipe.serve.wire import ServerGone

sock, data, epochs, pause, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
stream = enspipe.attach(sock, data=data, name=sys.argv[6] if len(sys.argv) > 6 else None, timeout=20)
as_torch, devices = len(sys.argv) > 7 and sys.argv[7] == "torch", set()
t0 = time.monotonic()
try:
    for e in range(epochs):
        for images, labels in (stream.torch() if as_torch else stream):
            assert len(images) == len(labels) and (as_torch or not images.flags.writeable)
            devices.add(str(images.device) if as_torch else "numpy")
            time.sleep(pause)
        with open(out + ".progress", "w") as f:
            f.write(str(e))
    result = {"epochs": stream.epochs(), "seconds": time.monotonic() - t0}
except ServerGone as err:
    result = {"error": str(err), "seconds": time.monotonic() - t0}
result["consumer"], result["devices"] = stream.consumer, sorted(devices)
stream.close()
with open(out, "w") as f:
    json.dump(result, f)
