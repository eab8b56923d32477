#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

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

/// One accepted connection: buffered reads with a timeout, whole writes.
final class HTTPConnection {
    let fd: Int32
    private var buffer: [UInt8] = []
    static let maxHeaderBytes = 64 * 1024

    init(fd: Int32, timeoutSeconds: Int) {
        self.fd = fd
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Reads more bytes; false at end of stream, timeout or error.
    private func fill() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                buffer.append(contentsOf: chunk[0..<n])
                return true
            }
            if n < 0 && errno == EINTR { continue }
            return false
        }
    }

    /// Reads one request; nil when the peer closed cleanly between requests.
    func readRequest(maxBody: Int) throws(HTTPReadError) -> HTTPRequest? {
        var headerEnd: Int?
        var searchFrom = 0
        while true {
            if buffer.count >= 4 {
                var i = max(0, searchFrom - 3)
                while i + 3 < buffer.count {
                    if buffer[i] == 13 && buffer[i + 1] == 10 && buffer[i + 2] == 13 && buffer[i + 3] == 10 { headerEnd = i; break }
                    i += 1
                }
                searchFrom = buffer.count
            }
            if headerEnd != nil { break }
            if buffer.count > Self.maxHeaderBytes { throw HTTPReadError(status: 431, message: "request headers over \(Self.maxHeaderBytes) bytes") }
            let had = buffer.count
            if !fill() {
                if had == 0 { return nil }
                throw HTTPReadError(status: nil, message: "the client stopped sending before the end of its headers")
            }
        }
        let head = String(decoding: buffer[0..<headerEnd!], as: UTF8.self)
        buffer.removeFirst(headerEnd! + 4)
        var lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst().split(separator: " ", omittingEmptySubsequences: true)
        guard requestLine.count == 3, requestLine[2].hasPrefix("HTTP/1.") else {
            throw HTTPReadError(status: 400, message: "malformed request line")
        }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { throw HTTPReadError(status: 400, message: "malformed header line") }
            let name = line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            headers[name] = value
        }
        if let te = headers["transfer-encoding"], te.lowercased() != "identity" {
            throw HTTPReadError(status: 400, message: "chunked request bodies are not supported; send Content-Length")
        }
        var length = 0
        if let cl = headers["content-length"] {
            guard let n = Int(cl), n >= 0 else { throw HTTPReadError(status: 400, message: "invalid Content-Length") }
            length = n
        }
        if length > maxBody { throw HTTPReadError(status: 413, message: "the body is \(length) bytes; the limit is \(maxBody)") }
        if headers["expect"]?.lowercased() == "100-continue" && buffer.count < length {
            write(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8))  // curl waits a second for it otherwise
        }
        while buffer.count < length {
            if !fill() { throw HTTPReadError(status: nil, message: "the client stopped sending before the end of its body") }
        }
        let body = Array(buffer[0..<length])
        buffer.removeFirst(length)

        let target = String(requestLine[1])
        let (rawPath, rawQuery) = target.firstIndex(of: "?").map { (String(target[..<$0]), String(target[target.index(after: $0)...])) } ?? (target, "")
        var query: [String: String] = [:]
        for pair in rawQuery.split(separator: "&") where !pair.isEmpty {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = Self.decode(String(kv[0])), let value = Self.decode(kv.count > 1 ? String(kv[1]) : "") else {
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
        let keepAlive = headers["connection"]?.lowercased() != "close" && requestLine[2] == "HTTP/1.1"
        return HTTPRequest(method: String(requestLine[0]), keys: keys, rawPath: rawPath, query: query,
                           headers: headers, body: body, keepAlive: keepAlive)
    }

    static func decode(_ s: String) -> String? {
        s.removingPercentEncoding  // "+" stays "+": firebase-admin does not encode its query values
    }

    /// Writes all of `bytes`; false if the peer is gone.
    @discardableResult
    func write(_ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            sent += n
        }
        return true
    }

    @discardableResult
    func write(_ response: HTTPResponse, keepAlive: Bool, serverTime: Int64) -> Bool {
        var head = "HTTP/1.1 \(response.status) \(HTTPResponse.reason(response.status))\r\n"
        for (k, v) in response.headers { head += "\(k): \(v)\r\n" }
        head += "X-Ferry-Server-Time: \(serverTime)\r\n"
        head += "Content-Length: \(response.body.count)\r\n"
        head += keepAlive ? "Connection: keep-alive\r\n" : "Connection: close\r\n"
        head += "\r\n"
        return write(Array(head.utf8) + response.body)
    }
}
