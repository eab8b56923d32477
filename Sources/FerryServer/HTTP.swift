import FerryWire
import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// A parsed HTTP/1.1 request.
struct HTTPRequest: Sendable {
    var method: String
    /// The path's keys, percent-decoded, with the trailing `.json` removed from the last one.
    var keys: [String]
    /// The raw path (for messages).
    var rawPath: String
    var query: [String: String]
    /// Header names in lowercase.
    var headers: [String: String]
    var body: [UInt8]
    var keepAlive: Bool
}

/// A response: status, headers, body.
struct HTTPResponse: Sendable {
    var status: Int
    var headers: [(String, String)] = []
    var body: [UInt8] = []

    static func json(_ status: Int, _ text: String, headers: [(String, String)] = []) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "application/json; charset=utf-8")] + headers, body: Array(text.utf8))
    }

    static func error(_ status: Int, _ message: String) -> HTTPResponse {
        json(status, "{\"error\":\(jsonString(message))}")
    }

    static func jsonString(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if u.value < 0x20 { out += String(format: "\\u%04x", u.value) } else { out.unicodeScalars.append(u) }
            }
        }
        return out + "\""
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 204: "No Content"
        case 304: "Not Modified"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 412: "Precondition Failed"
        case 413: "Payload Too Large"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }
}


/// Why a request could not be read; the connection answers (if it can) and closes.
struct HTTPReadError: Error {
    var status: Int?  // nil: the peer went away or timed out; just close
    var message: String
}

extension HTTPRequest {
    /// The request `head` names, with `body`: its target split into keys and query parameters.
    init(head: HTTPRequestHead, body: [UInt8]) throws(HTTPReadError) {
        var headers: [String: String] = [:]
        for (name, value) in head.headers { headers[name.lowercased()] = value }
        let target = head.uri
        let (rawPath, rawQuery) = target.firstIndex(of: "?").map { (String(target[..<$0]), String(target[target.index(after: $0)...])) } ?? (target, "")
        var query: [String: String] = [:]
        for pair in rawQuery.split(separator: "&") where !pair.isEmpty {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            // "+" stays "+": firebase-admin does not encode its query values.
            guard let name = String(kv[0]).removingPercentEncoding, let value = (kv.count > 1 ? String(kv[1]) : "").removingPercentEncoding else {
                throw HTTPReadError(status: 400, message: "malformed query string")
            }
            if query[name] != nil { throw HTTPReadError(status: 400, message: "the parameter \(name) is given twice") }
            query[name] = value
        }
        guard rawPath.hasPrefix("/") else { throw HTTPReadError(status: 400, message: "the path must start with /") }
        var keys: [String] = []
        for part in rawPath.split(separator: "/", omittingEmptySubsequences: true) {
            guard let k = String(part).removingPercentEncoding else { throw HTTPReadError(status: 400, message: "malformed percent-encoding in the path") }
            keys.append(k)
        }
        let keepAlive = headers["connection"]?.lowercased() != "close" && head.version == .http1_1
        self.init(method: head.method.rawValue, keys: keys, rawPath: rawPath, query: query, headers: headers, body: body, keepAlive: keepAlive)
    }
}

/// Keeps the bytes last read, ahead of the HTTP decoder, so that a request the decoder refuses
/// for its method can be told apart: a well-formed request line with an unknown method is a 405,
/// anything else a 400.
final class LastReadKeeper: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private(set) var last: ByteBuffer?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Kept only while the decoder reads it (its errors come synchronously): an idle
        // connection holds no read buffer.
        last = unwrapInboundIn(data)
        context.fireChannelRead(data)
        last = nil
    }

    /// Whether the last read starts with a request line shaped `METHOD TARGET HTTP/1.x`.
    var startsWithRequestLine: Bool {
        guard let last, let line = last.getString(at: last.readerIndex, length: min(last.readableBytes, 8192))?.split(separator: "\r\n", maxSplits: 1).first else { return false }
        let parts = line.split(separator: " ", omittingEmptySubsequences: false)
        return parts.count == 3 && !parts[0].isEmpty && parts[0].allSatisfy({ $0.isLetter || $0 == "-" || $0 == "_" }) && parts[1].hasPrefix("/") && parts[2].hasPrefix("HTTP/1.")
    }
}

/// Where a stream's events go: the connection's handler, on its event loop. Sendable, so the
/// namespace can send from any thread; each call is one task on the loop, in call order.
struct StreamOutput: Sendable {
    let handler: NIOLoopBound<HTTPServerHandler>

    /// Queues events for the connection (written together, one flush).
    func send(_ events: [StreamEvent]) {
        let h = handler
        h.eventLoop.execute { h.value.streamSend(events) }
    }

    /// Adds headers to the stream's answer (called before its first event).
    func addHeaders(_ headers: [(String, String)]) {
        let h = handler
        h.eventLoop.execute { h.value.streamHeaders += headers }
    }

    /// Bounds how long data sent on the connection may stay unacknowledged by the peer
    /// (`TCP_USER_TIMEOUT`): a peer gone silent (its machine off, its network cut) ends the
    /// connection once the stream's keep-alives have waited that long. Linux only.
    func limitSilence(milliseconds: Int) {
        let h = handler
        h.eventLoop.execute { h.value.limitSilence(milliseconds: milliseconds) }
    }

    /// Ends the stream (the terminating chunk) and closes the connection.
    func end() {
        let h = handler
        h.eventLoop.execute { h.value.streamEnd() }
    }

    /// Runs `cleanup` once the connection is gone (at once if it already is).
    func onClose(_ cleanup: @escaping @Sendable () -> Void) {
        let h = handler
        h.eventLoop.execute { h.value.attachStreamCleanup(cleanup) }
    }
}

/// One connection's HTTP/1.1 handling, on its event loop: assembles a request (body limit,
/// `Expect: 100-continue`, the request timeout), hands it to a Swift concurrency task, and writes
/// the answer back; a stream writes each event as it comes. Reads pause while a request is
/// being handled, so pipelined requests wait (bounded by one read) and are answered in order.
final class HTTPServerHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private enum State {
        /// Waiting for a request (the request timeout runs).
        case idle
        /// Receiving a request's body (the request timeout runs).
        case reading(HTTPRequestHead, ByteBuffer)
        /// Answered before the request ended (413): what is left of it is read and dropped, then the connection closes.
        case discarding
        /// A task is answering the request.
        case handling
        /// The connection carries an event stream until it ends.
        case streaming
        /// Closing or closed: nothing more is read or written.
        case closed
    }

    private let server: FerryServer
    private var configuration: ServerConfiguration { server.configuration }
    private var logger: Logger { server.configuration.logger }
    private var state = State.idle
    private var context: ChannelHandlerContext?
    /// Request parts that arrived while a request was being handled (pipelining).
    private var queued: [HTTPServerRequestPart] = []
    private var readPending = false
    /// When the request timeout fires (nil: not running). Timers are lazy (see ``Timer``).
    private var timeout = Timer()
    // Streams
    private var streamHeadWritten = false
    /// Headers the stream's answer adds (see ``StreamOutput/addHeaders(_:)``).
    var streamHeaders: [(String, String)] = []
    private var streamBytesUnsent = 0
    private var keepAlive = Timer()
    private var streamCleanup: (@Sendable () -> Void)?
    private var inactive = false

    private let lastRead: LastReadKeeper

    init(server: FerryServer, lastRead: LastReadKeeper) {
        self.server = server
        self.lastRead = lastRead
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        armTimeout()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        inactive = true
        state = .closed
        timeout.deadline = nil
        keepAlive.deadline = nil
        streamCleanup?()
        streamCleanup = nil
        context.fireChannelInactive()
    }

    // MARK: Reading requests

    func read(context: ChannelHandlerContext) {
        if case .handling = state {
            readPending = true  // resumes once the answer is written
            return
        }
        context.read()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        receive(unwrapInboundIn(data), context)
    }

    private func receive(_ part: HTTPServerRequestPart, _ context: ChannelHandlerContext) {
        switch state {
        case .handling:
            queued.append(part)
            return
        case .streaming, .closed:
            return  // a stream's client has nothing more to say
        case .discarding:
            armTimeout()
            if case .end = part { close(context) }
            return
        case .idle:
            guard case .head(let head) = part else { return }
            armTimeout()
            if let te = head.headers.first(name: "transfer-encoding"), te.lowercased() != "identity" {
                refuse(context, 400, "chunked request bodies are not supported; send Content-Length", discardRest: false)
                return
            }
            var length = 0
            if let cl = head.headers.first(name: "content-length") {
                guard let n = Int(cl), n >= 0 else {
                    refuse(context, 400, "invalid Content-Length", discardRest: false)
                    return
                }
                length = n
            }
            if length > configuration.maxBody {
                refuse(context, 413, "the body is \(length) bytes; the limit is \(configuration.maxBody)", discardRest: true)
                return
            }
            if head.headers.first(name: "expect")?.lowercased() == "100-continue" && length > 0 {
                // curl waits a second for it otherwise
                context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .continue))), promise: nil)
            }
            state = .reading(head, context.channel.allocator.buffer(capacity: min(length, 64 * 1024)))
        case .reading(let head, var body):
            armTimeout()
            switch part {
            case .head:
                return  // the decoder never sends two heads in a row
            case .body(var chunk):
                state = .handling  // no copy of the buffer while it grows
                body.writeBuffer(&chunk)
                if body.readableBytes > configuration.maxBody {
                    refuse(context, 413, "the body is over \(configuration.maxBody) bytes", discardRest: true)
                    return
                }
                state = .reading(head, body)
            case .end:
                timeout.deadline = nil
                let request: HTTPRequest
                do { request = try HTTPRequest(head: head, body: Array(body.readableBytesView)) } catch {
                    state = .idle
                    refuse(context, error.status ?? 400, error.message, discardRest: false)
                    return
                }
                guard server.admitRequest() else {
                    state = .idle
                    refuse(context, 503, "the server is shutting down", discardRest: false)
                    return
                }
                state = .handling
                let output = StreamOutput(handler: NIOLoopBound(self, eventLoop: context.eventLoop))
                let server = self.server
                Task {
                    let response = await server.respond(to: request, stream: output)
                    output.handler.eventLoop.execute { output.handler.value.answered(request, response) }
                }
            }
        }
    }

    /// Answers with an error and closes (after reading and dropping the rest of the request, when asked).
    private func refuse(_ context: ChannelHandlerContext, _ status: Int, _ message: String, discardRest: Bool) {
        logger.notice("closing a connection: \(message)")
        let written = write(.error(status, message), keepAlive: false, context)
        if discardRest {
            state = .discarding
            armTimeout()
        } else {
            close(context, after: written)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let e = error as? HTTPParserError {
            switch state {
            case .idle, .reading:
                timeout.deadline = nil
                let (status, message) = switch e {
                case .invalidMethod where lastRead.startsWithRequestLine: (405, "Unsupported method")
                case .headerOverflow: (431, "the request headers are too large")
                default: (400, "malformed request (\(e))")
                }
                state = .idle
                refuse(context, status, message, discardRest: false)
            default:
                close(context)
            }
            return
        }
        if !inactive { logger.debug("closing a connection: \(error)") }
        close(context)
    }

    /// The request timeout: a client that sends nothing for that long while the server waits for
    /// its first request, or for the rest of one, is disconnected without an answer. Between
    /// requests the wait is the idle timeout (`seconds`).
    private func armTimeout(seconds: Int? = nil) {
        timeout.deadline = .now() + .seconds(Int64(seconds ?? configuration.requestTimeoutSeconds))
        scheduleTimeout()
    }

    private func scheduleTimeout() {
        guard let context, let deadline = timeout.deadline, !timeout.scheduled else { return }
        timeout.scheduled = true
        context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in
            timeout.scheduled = false
            guard let context = self.context, let due = timeout.deadline else { return }
            if due > .now() {
                scheduleTimeout()  // pushed back since: wait again
                return
            }
            timeout.deadline = nil
            let seconds = configuration.requestTimeoutSeconds
            switch state {
            case .idle:
                close(context)
            case .reading, .discarding:
                logger.notice("closing a connection: the client sent nothing for \(seconds) s before the end of its request")
                close(context)
            case .handling, .streaming, .closed:
                break
            }
        }
    }

    /// Closes once `written` is on its way (or failed): the answer is not cut off.
    private func close(_ context: ChannelHandlerContext, after written: EventLoopFuture<Void>) {
        state = .closed
        timeout.deadline = nil
        keepAlive.deadline = nil
        written.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }

    private func close(_ context: ChannelHandlerContext) {
        if case .closed = state, inactive { return }
        state = .closed
        timeout.deadline = nil
        keepAlive.deadline = nil
        context.close(promise: nil)
    }

    // MARK: Writing answers

    /// The task's answer: written, then the connection reads the next request or closes.
    /// nil: the request became a stream. The request stops counting as in flight once its answer
    /// is written, so a shutdown does not close the connection under it.
    fileprivate func answered(_ request: HTTPRequest, _ response: HTTPResponse?) {
        let server = self.server
        guard let context, case .handling = state else {
            server.finishRequest()
            return
        }
        guard let response else {
            server.finishRequest()
            startStream(context)
            return
        }
        if response.status >= 400 {
            logger.info("\(request.method.prefix(20)) \(request.rawPath.prefix(200)) → \(response.status) \(String(decoding: response.body.prefix(200), as: UTF8.self))")
        }
        let keepAlive = request.keepAlive && response.status != 413
        let written = write(response, keepAlive: keepAlive, context)
        written.assumeIsolated().whenComplete { _ in server.finishRequest() }
        guard keepAlive else {
            close(context, after: written)
            return
        }
        state = .idle
        armTimeout(seconds: configuration.idleTimeoutSeconds)
        let parts = queued
        queued = []
        for (i, part) in parts.enumerated() {
            receive(part, context)
            if case .handling = state {
                queued = Array(parts[(i + 1)...]) + queued
                return
            }
        }
        if readPending {
            readPending = false
            context.read()
        }
    }

    @discardableResult
    private func write(_ response: HTTPResponse, keepAlive: Bool, _ context: ChannelHandlerContext) -> EventLoopFuture<Void> {
        var headers = HTTPHeaders()
        for (k, v) in response.headers { headers.add(name: k, value: v) }
        headers.add(name: "X-Ferry-Server-Time", value: String(server.now()))
        headers.add(name: "Content-Length", value: String(response.body.count))
        headers.add(name: "Connection", value: keepAlive ? "keep-alive" : "close")
        let head = HTTPResponseHead(version: .http1_1, status: HTTPResponseStatus(statusCode: response.status), headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if !response.body.isEmpty {
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: response.body)))), promise: nil)
        }
        return context.writeAndFlush(wrapOutboundOut(.end(nil)))
    }

    // MARK: Streams

    private func startStream(_ context: ChannelHandlerContext) {
        guard !streamHeadWritten else { return }
        streamHeadWritten = true
        state = .streaming
        timeout.deadline = nil
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/event-stream")
        headers.add(name: "Cache-Control", value: "no-cache")
        headers.add(name: "X-Ferry-Server-Time", value: String(server.now()))
        headers.add(name: "Transfer-Encoding", value: "chunked")
        for (k, v) in streamHeaders { headers.add(name: k, value: v) }
        context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
        // A stream does not read further requests, but it must see its client go away.
        if readPending {
            readPending = false
            context.read()
        }
        queued = []
        armKeepAlive()
    }

    /// Writes one event; a client that does not read has its stream closed once more than the
    /// configured bytes wait unsent, so a slow stream cannot grow the server's memory without bound.
    func streamSend(_ events: [StreamEvent]) {
        guard let context, !inactive else { return }
        switch state {
        case .handling: startStream(context)
        case .streaming: break
        default: return
        }
        if streamBytesUnsent > configuration.maxStreamBufferBytes {
            logger.warning("closing a stream whose client does not keep up: \(streamBytesUnsent) bytes wait unsent (limit \(configuration.maxStreamBufferBytes))")
            close(context)
            return
        }
        var buffer = context.channel.allocator.buffer(capacity: 256 * events.count)
        for event in events { buffer.writeString(event.encoded) }
        let n = buffer.readableBytes
        streamBytesUnsent += n
        let promise = context.eventLoop.makePromise(of: Void.self)
        promise.futureResult.assumeIsolated().whenComplete { [self] _ in streamBytesUnsent -= n }
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: promise)
        armKeepAlive()
    }

    /// Ends the stream: the terminating chunk, then the connection closes.
    func streamEnd() {
        guard let context, !inactive else { return }
        switch state {
        case .handling: startStream(context)
        case .streaming: break
        default: return
        }
        keepAlive.deadline = nil
        state = .closed
        close(context, after: context.writeAndFlush(wrapOutboundOut(.end(nil))))
    }

    func limitSilence(milliseconds: Int) {
        #if os(Linux)
        guard let context else { return }
        let option = ChannelOptions.Types.SocketOption(level: .tcp, name: NIOBSDSocket.Option(rawValue: CInt(TCP_USER_TIMEOUT)))
        context.channel.setOption(option, value: SocketOptionValue(milliseconds)).whenFailure { [logger] error in
            logger.warning("cannot bound a presence stream's silence: \(error)")
        }
        #endif
    }

    func attachStreamCleanup(_ cleanup: @escaping @Sendable () -> Void) {
        if inactive { cleanup() } else { streamCleanup = cleanup }
    }

    /// After this much silence on a stream, a `keep-alive` event.
    private func armKeepAlive() {
        keepAlive.deadline = .now() + .seconds(Int64(configuration.keepAliveSeconds))
        scheduleKeepAlive()
    }

    private func scheduleKeepAlive() {
        guard let context, let deadline = keepAlive.deadline, !keepAlive.scheduled else { return }
        keepAlive.scheduled = true
        context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in
            keepAlive.scheduled = false
            guard let due = keepAlive.deadline else { return }
            if due > .now() {
                scheduleKeepAlive()
                return
            }
            keepAlive.deadline = nil
            streamSend([.keepAlive])  // arms the next one
        }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        context.write(data, promise: promise)
    }

    /// A lazy timer: moving or stopping it only changes `deadline`; at most one task is
    /// scheduled, and when it runs early it schedules itself again for the new deadline. NIO
    /// cancels a scheduled task by searching all of the loop's scheduled tasks, so a timer
    /// cancelled and rescheduled on every event would cost O(connections) per event.
    private struct Timer {
        var deadline: NIODeadline?
        var scheduled = false
    }
}
