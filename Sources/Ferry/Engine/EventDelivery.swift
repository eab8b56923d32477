import Dispatch
import FerryLog
import Synchronization

/// Delivers events in the order they were raised, outside the database's lock, one batch at
/// a time; on a caller-chosen queue if there is one, else on the thread that drains.
///
/// A listener may call back into the database: its own events are then delivered after it
/// returns, by whoever is draining.
final class EventDelivery: Sendable {
    struct State {
        var batches: [(seq: UInt64, events: [DeliveredEvent])] = []
        var nextSeq: UInt64 = 1
        var delivered: UInt64 = 0
        var draining = false
        var waiters: [(seq: UInt64, continuation: UnsafeContinuation<Void, Never>)] = []
    }

    private let state = FerryMutex(State())
    let queue: DispatchQueue?

    init(queue: DispatchQueue?) { self.queue = queue }

    /// Queues a batch (call it under the database's lock, so batches keep the engine's order).
    func enqueue(_ events: [DeliveredEvent]) -> UInt64 {
        state.withLock { s in
            let seq = s.nextSeq
            s.nextSeq += 1
            if events.isEmpty && s.batches.isEmpty && !s.draining {
                // Nothing to deliver and every batch before it delivered (no one is draining,
                // none is queued): delivered already. (Most writes raise no event.)
                s.delivered = seq
            } else {
                s.batches.append((seq, events))
            }
            return seq
        }
    }

    /// Delivers every queued batch, unless someone else is already doing it.
    func drain() {
        let start = state.withLock { s -> Bool in
            if s.draining || s.batches.isEmpty { return false }
            s.draining = true
            return true
        }
        guard start else { return }
        while true {
            let next = state.withLock { s -> (UInt64, [DeliveredEvent])? in
                if s.batches.isEmpty {
                    s.draining = false
                    return nil
                }
                let b = s.batches.removeFirst()
                return (b.seq, b.events)
            }
            guard let (seq, events) = next else { return }
            if !events.isEmpty {
                if let queue {
                    queue.async { for e in events { e.event.registration.handler(e.event, e.metadata) } }
                } else {
                    for e in events { e.event.registration.handler(e.event, e.metadata) }
                }
            }
            let ready = state.withLock { s -> [UnsafeContinuation<Void, Never>] in
                s.delivered = seq
                var ready: [UnsafeContinuation<Void, Never>] = []
                s.waiters.removeAll { w in
                    if w.seq <= seq { ready.append(w.continuation); return true }
                    return false
                }
                return ready
            }
            for c in ready { c.resume() }
        }
    }

    /// Whether batch `seq` has been delivered.
    func isDelivered(_ seq: UInt64) -> Bool { state.withLock { $0.delivered >= seq } }

    /// Returns once batch `seq` has been delivered (handed to the queue, if there is one).
    func waitDelivered(_ seq: UInt64) async {
        if isDelivered(seq) { return }
        await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
            let done = state.withLock { s -> Bool in
                if s.delivered >= seq { return true }
                s.waiters.append((seq, c))
                return false
            }
            if done { c.resume() }
        }
    }
}
