"""google-cloud-firestore (PyPI) driving ferry-server's Firestore API, with an assertion on every result.

Usage: FIRESTORE_EMULATOR_HOST=127.0.0.1:PORT python test_ferry_firestore.py HTTP_HOST:PORT
(HTTP_HOST:PORT is the server's REST port, for the emulator's clear-data request).
Exits non-zero on the first failure; prints "all firestore checks passed" at the end.
"""
import datetime
import math
import queue
import sys
import threading
import urllib.request

from google.api_core import exceptions
from google.cloud import firestore
from google.cloud.firestore_v1 import transforms
from google.cloud.firestore_v1.base_query import And, FieldFilter, Or

HTTP = sys.argv[1]
PROJECT = "ferry-test"
db = firestore.Client(project=PROJECT)
other = firestore.Client(project=PROJECT)  # a second client, for changes others make


def check(name, got, want):
    if got != want:
        print(f"FAIL {name}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
    print(f"ok   {name}")


def raises(name, kind, fn):
    try:
        fn()
    except kind:
        print(f"ok   {name}")
        return
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {name}: raised {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"FAIL {name}: did not raise {kind.__name__}", file=sys.stderr)
    sys.exit(1)


def clear():
    req = urllib.request.Request(
        f"http://{HTTP}/emulator/v1/projects/{PROJECT}/databases/(default)/documents", method="DELETE")
    with urllib.request.urlopen(req) as r:
        return r.status


check("clear data", clear(), 200)

# --- Documents: set, get, merge, update with transforms, delete, create, add -------------------
cities = db.collection("cities")
sf = cities.document("SF")
sf.set({"name": "San Francisco", "state": "CA", "population": 860000, "tags": ["west", "coast"], "capital": False})
s1 = sf.get()
check("get after set", s1.to_dict(), {"name": "San Francisco", "state": "CA", "population": 860000, "tags": ["west", "coast"], "capital": False})
check("a new document's create and update times are equal", s1.create_time == s1.update_time, True)
check("get of a missing document", cities.document("nowhere").get().exists, False)

sf.set({"population": 870000, "extra": {"a": 1}}, merge=True)
check("set with merge keeps other fields", sf.get().to_dict(), {"name": "San Francisco", "state": "CA", "population": 870000, "tags": ["west", "coast"], "capital": False, "extra": {"a": 1}})

sf.update({
    "population": firestore.Increment(5),
    "tags": firestore.ArrayUnion(["bay", "west"]),
    "updated": firestore.SERVER_TIMESTAMP,
    "extra.b": 2,
    "capital": firestore.DELETE_FIELD,
})
s2 = sf.get()
d = s2.to_dict()
check("increment", d["population"], 870005)
check("array union adds only what is missing", d["tags"], ["west", "coast", "bay"])
check("server timestamp is a time", isinstance(d["updated"], datetime.datetime), True)
check("server timestamp is the update time", d["updated"] == s2.update_time, True)
check("dotted update sets a nested field", d["extra"], {"a": 1, "b": 2})
check("delete field", "capital" in d, False)
check("create time kept", s2.create_time == s1.create_time, True)
check("update time bumped", s2.update_time > s1.update_time, True)

sf.update({"tags": firestore.ArrayRemove(["coast"]), "population": firestore.Increment(0.5)})
sf.update({"hi": transforms.Maximum(3), "lo": transforms.Minimum(3)})
sf.update({"hi": transforms.Maximum(1), "lo": transforms.Minimum(1)})
d = sf.get().to_dict()
check("array remove", d["tags"], ["west", "bay"])
check("increment by a double makes a double", d["population"], 870005.5)
check("maximum", d["hi"], 3)
check("minimum", d["lo"], 1)

raises("update of a missing document is NotFound", exceptions.NotFound, lambda: cities.document("nowhere").update({"a": 1}))
raises("create of an existing document is AlreadyExists", exceptions.AlreadyExists, lambda: sf.create({"a": 1}))
la = cities.document("LA")
la.create({"name": "Los Angeles", "state": "CA", "population": 3900000})
check("create of a new document", la.get().get("name"), "Los Angeles")

_, added = cities.add({"name": "Tokyo", "population": 14000000})
check("add makes a 20-character id", len(added.id), 20)
check("add wrote the document", added.get().get("name"), "Tokyo")
added.delete()
check("delete", added.get().exists, False)

stale = la.get().update_time
la.update({"population": 3900001})
raises("a delete whose update time is stale fails its precondition", exceptions.FailedPrecondition,
       lambda: la.delete(option=db.write_option(last_update_time=stale)))
check("the refused delete left the document", la.get().exists, True)

# Every value type round-trips.
values = {
    "null": None, "t": True, "f": False, "max": 2**63 - 1, "min": -(2**63), "pi": 3.25, "negzero": -0.0,
    "s": "héllo", "b": b"\x00\x01\xff", "when": datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc),
    "geo": firestore.GeoPoint(37.5, -122.25), "ref": sf, "arr": [1, "a", None, {"m": [2]}], "map": {"x": {"y": {"z": 1}}},
    "a.b": "dotted name",
}
typed = db.collection("types").document("all")
typed.set(values)
got = typed.get().to_dict()
for k, v in values.items():
    if k == "ref":
        check("value ref", got[k].path, sf.path)
    else:
        check(f"value {k}", got[k], v)
check("-0.0 keeps its sign", math.copysign(1, got["negzero"]), -1.0)
typed.set({"nan": float("nan")})
check("NaN round-trips", math.isnan(typed.get().get("nan")), True)
raises("a document over 1 MiB is refused", exceptions.InvalidArgument, lambda: typed.set({"big": "x" * (1024 * 1024 + 10)}))
deep = {"v": 1}
for _ in range(25):
    deep = {"d": deep}
raises("nesting past 20 is refused", exceptions.InvalidArgument, lambda: typed.set(deep))

# --- Batches --------------------------------------------------------------------------------
batch = db.batch()
for i in range(3):
    batch.set(db.collection("batch").document(f"b{i}"), {"i": i})
batch.delete(la)
batch.commit()
check("a batch wrote all", sorted(s.get("i") for s in db.collection("batch").stream()), [0, 1, 2])
check("and deleted", la.get().exists, False)
bad = db.batch()
bad.set(db.collection("batch").document("b9"), {"i": 9})
bad.create(db.collection("batch").document("b0"), {"i": 0})
raises("a batch with a failing write fails", exceptions.AlreadyExists, bad.commit)
check("and writes none of it", db.collection("batch").document("b9").get().exists, False)

# --- Queries ---------------------------------------------------------------------------------
q = db.collection("q")
for n in range(10):
    doc = {"n": n, "even": n % 2 == 0, "tags": [f"t{n % 3}", "all"], "group": "low" if n < 5 else "high"}
    if n == 4:
        del doc["group"]
    q.document(f"d{n}").set(doc)


def ns(query):
    return [s.get("n") for s in query.get()]


check("range and order", ns(q.where(filter=FieldFilter("n", ">=", 3)).where(filter=FieldFilter("n", "<", 7)).order_by("n")), [3, 4, 5, 6])
check("equality", ns(q.where(filter=FieldFilter("even", "==", True)).order_by("n")), [0, 2, 4, 6, 8])
check("not-equal excludes documents without the field", ns(q.where(filter=FieldFilter("group", "!=", "low")).order_by("group").order_by("n")), [5, 6, 7, 8, 9])
check("in", ns(q.where(filter=FieldFilter("n", "in", [1, 7, 42])).order_by("n")), [1, 7])
check("not-in", ns(q.where(filter=FieldFilter("n", "not-in", [0, 1, 2, 3, 4, 5, 6])).order_by("n")), [7, 8, 9])
check("array-contains", ns(q.where(filter=FieldFilter("tags", "array_contains", "t1")).order_by("n")), [1, 4, 7])
check("array-contains-any", ns(q.where(filter=FieldFilter("tags", "array_contains_any", ["t0", "t2"])).order_by("n")), [0, 2, 3, 5, 6, 8, 9])
check("or", ns(q.where(filter=Or([FieldFilter("n", "==", 1), FieldFilter("n", "==", 8)])).order_by("n")), [1, 8])
check("and inside or", ns(q.where(filter=Or([And([FieldFilter("even", "==", True), FieldFilter("n", ">", 6)]), FieldFilter("n", "==", 1)])).order_by("n")), [1, 8])
check("descending with a limit", ns(q.order_by("n", direction=firestore.Query.DESCENDING).limit(3)), [9, 8, 7])
check("limit to last", ns(q.order_by("n").limit_to_last(2)), [8, 9])
check("offset", ns(q.order_by("n").offset(7)), [7, 8, 9])
check("start at", ns(q.order_by("n").start_at({"n": 7})), [7, 8, 9])
check("start after", ns(q.order_by("n").start_after({"n": 7})), [8, 9])
check("end at", ns(q.order_by("n").end_at({"n": 2})), [0, 1, 2])
check("end before", ns(q.order_by("n").end_before({"n": 2})), [0, 1])
five = q.document("d5").get()
check("start after a snapshot", ns(q.order_by("n").start_after(five)), [6, 7, 8, 9])
check("end at a snapshot", ns(q.order_by("n").end_at(five).limit(2)), [0, 1])
check("select returns only the fields asked", [s.to_dict() for s in q.select(["n"]).where(filter=FieldFilter("n", "==", 3)).stream()], [{"n": 3}])
check("a query with no match", ns(q.where(filter=FieldFilter("n", ">", 100))), [])

sf.collection("landmarks").document("bridge").set({"name": "Golden Gate", "kind": "bridge"})
sf.collection("landmarks").document("park").set({"name": "Presidio", "kind": "park"})
cities.document("NYC").collection("landmarks").document("bridge").set({"name": "Brooklyn", "kind": "bridge"})
check("collection group", sorted(s.get("name") for s in db.collection_group("landmarks").where(filter=FieldFilter("kind", "==", "bridge")).stream()), ["Brooklyn", "Golden Gate"])

res = q.count(alias="c").get()
check("count", res[0][0].value, 10)
check("count of a filtered query", q.where(filter=FieldFilter("even", "==", True)).count().get()[0][0].value, 5)
check("sum", q.sum("n").get()[0][0].value, 45)
check("average", q.avg("n").get()[0][0].value, 4.5)

# --- Listing ---------------------------------------------------------------------------------
check("collections", sorted(c.id for c in db.collections()), ["batch", "cities", "q", "types"])
check("a document's collections", [c.id for c in sf.collections()], ["landmarks"])
check("list documents includes a missing parent of a subcollection",
      sorted(d.id for d in cities.list_documents()), ["NYC", "SF"])

# --- Transactions ------------------------------------------------------------------------------
counter = db.collection("counters").document("c")
counter.set({"v": 0})


@firestore.transactional
def increment(transaction, ref):
    snap = ref.get(transaction=transaction)
    transaction.update(ref, {"v": snap.get("v") + 1})


per_thread, threads_n = 10, 4
failures = []


def worker():
    client = firestore.Client(project=PROJECT)
    ref = client.collection("counters").document("c")
    done = 0
    while done < per_thread:
        try:
            increment(client.transaction(), ref)
            done += 1
        except ValueError:
            pass  # five aborted attempts in a row under contention: run it again
        except Exception as e:  # noqa: BLE001
            failures.append(repr(e))
            return


threads = [threading.Thread(target=worker) for _ in range(threads_n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check("no transaction failed otherwise", failures, [])
check("contended transactions count each increment once", counter.get().get("v"), per_thread * threads_n)


@firestore.transactional
def read_only(transaction, ref):
    return ref.get(transaction=transaction).get("v")


check("a transaction that only reads commits", read_only(db.transaction(), counter), per_thread * threads_n)

# --- Listeners ---------------------------------------------------------------------------------
events = queue.Queue()
watch_ref = db.collection("watched").document("w")
watch_ref.set({"v": 1})
doc_watch = watch_ref.on_snapshot(lambda docs, changes, read_time: events.put([d.to_dict() if d.exists else None for d in docs]))


def next_event(name):
    try:
        return events.get(timeout=30)
    except queue.Empty:
        print(f"FAIL {name}: no snapshot within 30 s", file=sys.stderr)
        sys.exit(1)


check("document listener's first snapshot", next_event("first doc snapshot"), [{"v": 1}])
other.collection("watched").document("w").update({"v": 2})
check("document listener sees another client's update", next_event("doc update"), [{"v": 2}])
other.collection("watched").document("w").delete()
ev = next_event("doc delete")
check("document listener sees the delete", ev in ([], [None]), True)
doc_watch.unsubscribe()

qevents = queue.Queue()
query = db.collection("q").where(filter=FieldFilter("n", ">=", 8))
q_watch = query.on_snapshot(lambda docs, changes, read_time: qevents.put(
    (sorted(d.get("n") for d in docs), sorted((c.type.name, c.document.get("n") if c.type.name != "REMOVED" else c.document.id) for c in changes))))


def next_q(name):
    try:
        return qevents.get(timeout=30)
    except queue.Empty:
        print(f"FAIL {name}: no snapshot within 30 s", file=sys.stderr)
        sys.exit(1)


check("query listener's first snapshot", next_q("first query snapshot"), ([8, 9], [("ADDED", 8), ("ADDED", 9)]))
other.collection("q").document("d10").set({"n": 10})
check("query listener sees a document added", next_q("added"), ([8, 9, 10], [("ADDED", 10)]))
other.collection("q").document("d10").update({"x": 1})
check("query listener sees it modified", next_q("modified"), ([8, 9, 10], [("MODIFIED", 10)]))
other.collection("q").document("d9").update({"n": 1})
check("query listener sees a document leave the query", next_q("left"), ([8, 10], [("REMOVED", "d9")]))
other.collection("q").document("d10").delete()
check("query listener sees a delete", next_q("deleted"), ([8], [("REMOVED", "d10")]))
q_watch.unsubscribe()

# --- The emulator's clear ----------------------------------------------------------------------
check("clear data again", clear(), 200)
check("clear removed every document", len(list(db.collection("q").stream())), 0)
check("and every collection", list(db.collections()), [])

print("all firestore checks passed")
