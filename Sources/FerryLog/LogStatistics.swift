/// What the log's writer has done since the store was opened.
public struct LogStatistics: Sendable, Equatable {
    /// Records appended.
    public var records: UInt64 = 0
    /// Writer rounds: each takes every batch waiting and writes it with one `write` (per MiB).
    public var rounds: UInt64 = 0
    /// Data frames written.
    public var frames: UInt64 = 0
    /// `fdatasync` calls on segments (group commit: far fewer than appends under load).
    public var syncs: UInt64 = 0
    /// Bytes written to segment files (frames, seals).
    public var bytesWritten: UInt64 = 0
    /// Segments sealed and started.
    public var rolls: UInt64 = 0
}
