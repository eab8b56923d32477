"""firebase-admin (PyPI) driving ferry-server, with an assertion on every result.

Usage: FIREBASE_DATABASE_EMULATOR_HOST=127.0.0.1:PORT python test_ferry_server.py TOKEN
(TOKEN is a token the server was started with: --token TOKEN). Exits non-zero on failure.
"""
import json
import os
import queue
import sys
import time
import urllib.error
import urllib.request

import firebase_admin
from firebase_admin import db, exceptions

HOST = os.environ["FIREBASE_DATABASE_EMULATOR_HOST"]
TOKEN = sys.argv[1]
NS = "admin-test"
URL = f"https://{NS}.firebaseio.com"

app = firebase_admin.initialize_app(options={"databaseURL": URL, "projectId": "ferry-test"})
root = db.reference("/", app=app)


def check(name, got, want):
    if got != want:
        print(f"FAIL {name}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
    print(f"ok   {name}")


def raw(method, path, body=None, token=None):
    """A plain request, for what firebase-admin cannot send (a user's token)."""
    req = urllib.request.Request(f"http://{HOST}/{path}.json?ns={NS}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


# Reset, set, get.
root.delete()
check("empty root", root.get(), None)
users = db.reference("users", app=app)
users.set({"alice": {"name": "Alice", "age": 31}, "bob": {"name": "Bob", "age": 25}})
check("get after set", users.get(), {"alice": {"name": "Alice", "age": 31}, "bob": {"name": "Bob", "age": 25}})
check("get a leaf", users.child("alice/name").get(), "Alice")
check("get absent", users.child("nobody").get(), None)

# Update: multi-path, null deletes.
users.update({"alice/age": 32, "bob/name": None, "carol": {"name": "Carol", "age": 40}})
check("update", users.get(), {"alice": {"name": "Alice", "age": 32}, "bob": {"age": 25}, "carol": {"name": "Carol", "age": 40}})

# Push.
posts = db.reference("posts", app=app)
p1 = posts.push({"title": "first"})
p2 = posts.push({"title": "second"})
check("push ids are 20 characters", (len(p1.key), len(p2.key)), (20, 20))
check("push ids sort in order", p1.key < p2.key, True)
check("pushed data", posts.get(), {p1.key: {"title": "first"}, p2.key: {"title": "second"}})

# Delete.
p2.delete()
check("delete", posts.get(), {p1.key: {"title": "first"}})

# Server values.
stats = db.reference("stats", app=app)
before = int(time.time() * 1000)
stats.set({"at": {".sv": "timestamp"}, "count": 5})
at = stats.child("at").get()
check("timestamp resolved by the server", isinstance(at, int) and before - 5000 <= at <= int(time.time() * 1000) + 5000, True)
stats.update({"count": {".sv": {"increment": 3}}})
check("increment", stats.child("count").get(), 8)
stats.child("fresh").set({".sv": {"increment": 2}})
check("increment of nothing", stats.child("fresh").get(), 2)

# ETags and transactions.
counter = db.reference("counter", app=app)
counter.set(10)
value, etag = counter.get(etag=True)
check("get with etag", (value, isinstance(etag, str) and len(etag) > 0), (10, True))
changed, v, e = counter.get_if_changed(etag)
check("unchanged since etag", (changed, v, e), (False, None, None))
ok, v, e2 = counter.set_if_unchanged(etag, 11)
check("set_if_unchanged with the right etag", (ok, v), (True, 11))
ok, v, e3 = counter.set_if_unchanged(etag, 99)
check("set_if_unchanged with a stale etag", (ok, v, e3), (False, 11, e2))
changed, v, e = counter.get_if_changed(etag)
check("changed since etag", (changed, v, e), (True, 11, e2))
check("transaction", counter.transaction(lambda c: (c or 0) + 1), 12)
check("after transaction", counter.get(), 12)
fresh = db.reference("fresh-counter", app=app)
check("transaction on absent data", fresh.transaction(lambda c: (c or 0) + 1), 1)

# Queries.
scores = db.reference("scores", app=app)
scores.set({"a": {"s": 5}, "b": {"s": 1}, "c": {"s": 9}, "d": {"s": 3}, "e": {"t": 0}})
check("order_by_child limit_to_first", list(scores.order_by_child("s").limit_to_first(2).get().keys()), ["e", "b"])
check("order_by_child start_at", list(scores.order_by_child("s").start_at(3).get().keys()), ["d", "a", "c"])
check("order_by_child end_at limit_to_last", list(scores.order_by_child("s").end_at(5).limit_to_last(2).get().keys()), ["d", "a"])
check("order_by_child equal_to", scores.order_by_child("s").equal_to(9).get(), {"c": {"s": 9}})
check("order_by_key range", list(scores.order_by_key().start_at("b").end_at("d").get().keys()), ["b", "c", "d"])
nums = db.reference("nums", app=app)
nums.set({"x": 3, "y": 1, "z": 2})
check("order_by_value limit_to_last", list(nums.order_by_value().limit_to_last(2).get().items()), [("z", 2), ("x", 3)])

# Shallow reads.
check("shallow", users.get(shallow=True), {"alice": True, "bob": True, "carol": True})
check("shallow leaf", counter.get(shallow=True), 12)

# A listener: the whole value first, then each change.
events = queue.Queue()
feed = db.reference("feed", app=app)
feed.set({"a": 1})
registration = feed.listen(lambda e: events.put((e.event_type, e.path, e.data)))
try:
    check("listener: first event", events.get(timeout=10), ("put", "/", {"a": 1}))
    feed.child("b").set(2)
    check("listener: set below", events.get(timeout=10), ("put", "/b", 2))
    feed.update({"a": 5, "c/d": 7})
    check("listener: update", events.get(timeout=10), ("patch", "/", {"a": 5, "c/d": 7}))
    feed.delete()
    check("listener: delete", events.get(timeout=10), ("put", "/", None))
finally:
    registration.close()

# Rules: owner only sets them; then with and without a token.
rules = {"rules": {".read": False, ".write": False,
                   "public": {".read": True, ".write": True},
                   "members": {".read": "auth != null", ".write": "auth != null"}}}
check("set rules (owner)", raw("PUT", ".settings/rules", rules, token="owner"), (200, {"status": "ok"}))
check("get rules (owner)", raw("GET", ".settings/rules", token="owner"), (200, rules))
check("set rules without a token", raw("PUT", ".settings/rules", rules)[0], 401)

anon_app = firebase_admin.initialize_app(options={"databaseURL": URL, "databaseAuthVariableOverride": None}, name="anon")
user_app = firebase_admin.initialize_app(options={"databaseURL": URL, "databaseAuthVariableOverride": {"uid": "u1"}}, name="user")
db.reference("public/x", app=anon_app).set(1)
check("anonymous writes where allowed", db.reference("public/x", app=app).get(), 1)
try:
    db.reference("members/x", app=anon_app).set(1)
    check("anonymous write denied", "no error", "error")
except exceptions.UnauthenticatedError as e:
    check("anonymous write denied", str(e), "Permission denied")
db.reference("members/x", app=user_app).set(2)
check("authenticated write allowed", db.reference("members/x", app=user_app).get(), 2)
try:
    db.reference("users", app=user_app).get()
    check("read denied by the root rule", "no error", "error")
except exceptions.UnauthenticatedError as e:
    check("read denied by the root rule", str(e), "Permission denied")
check("token accepted by rules", raw("PUT", "members/y", 3, token=TOKEN), (200, 3))
check("no token denied", raw("PUT", "members/y", 4), (401, {"error": "Permission denied"}))
check("unknown token refused", raw("GET", "public/x", token="not-a-token"), (401, {"error": "Auth token is expired"}))
check("data after rules", db.reference("members", app=app).get(), {"x": 2, "y": 3})

# Bad input gets a clear 400.
try:
    db.reference("scores", app=app).order_by_child("s").limit_to_first(10**12).get()
    check("absurd limit rejected", "no error", "error")
except exceptions.InvalidArgumentError as e:
    check("absurd limit rejected", "limitToFirst" in str(e), True)

print("all firebase-admin checks passed")
