"""google-cloud-firestore and Ferry's client on one project: each one's writes reach the other's listener.

Usage: FIRESTORE_EMULATOR_HOST=127.0.0.1:PORT python interop.py PROJECT
Writes interop/from-python, then waits (at most 300 s) until its listener on the collection
shows interop/from-ferry = {"by": "ferry", "n": 42}, and prints "python saw ferry".
"""
import queue
import sys

from google.cloud import firestore

db = firestore.Client(project=sys.argv[1])
seen = queue.Queue()


def on_snapshot(docs, changes, read_time):
    for d in docs:
        if d.id == "from-ferry":
            seen.put(d.to_dict())


watch = db.collection("interop").on_snapshot(on_snapshot)
db.collection("interop").document("from-python").set({"by": "python", "n": 7})
print("python wrote", flush=True)
try:
    got = seen.get(timeout=300)
except queue.Empty:
    print("FAIL: python's listener never saw from-ferry", file=sys.stderr)
    sys.exit(1)
watch.unsubscribe()
if got != {"by": "ferry", "n": 42}:
    print(f"FAIL: from-ferry is {got!r}", file=sys.stderr)
    sys.exit(1)
print("python saw ferry", flush=True)
