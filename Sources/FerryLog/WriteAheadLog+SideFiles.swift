extension WriteAheadLog {
    /// Creates or replaces a file beside the log (a database checkpoint, say), atomically and
    /// durably: after a crash the file is either absent, the old version, or complete.
    ///
    /// The log never reads these files and ``LogInspection`` ignores them; their content is the
    /// caller's. Names may not contain `/` nor collide with the log's own files.
    public func writeSideFile(named name: String, contents: [UInt8]) throws {
        try checkSideFileName(name)
        try directory.createAtomically(name, contents: contents)
    }

    /// The contents of a side file, or nil if there is none of that name.
    public func readSideFile(named name: String) throws -> [UInt8]? {
        try checkSideFileName(name)
        guard directory.exists(name) else { return nil }
        return try readWholeFile(directory, name)
    }

    /// The names of the side files whose names start with `prefix`.
    public func sideFiles(withPrefix prefix: String) throws -> [String] {
        try directory.list().filter {
            $0.hasPrefix(prefix) && !$0.hasSuffix(LogFormat.segmentSuffix) && !$0.hasSuffix(LogFormat.temporarySuffix)
                && $0 != LogFormat.lockFileName && $0 != LogFormat.startFileName
        }.sorted()
    }

    /// Removes side files durably.
    public func removeSideFiles(named names: [String]) throws {
        for n in names { try checkSideFileName(n) }
        try directory.remove(names)
    }

    private func checkSideFileName(_ name: String) throws {
        guard !name.isEmpty, !name.contains("/"), name != LogFormat.lockFileName, name != LogFormat.startFileName,
              !name.hasSuffix(LogFormat.segmentSuffix), !name.hasSuffix(LogFormat.temporarySuffix), name != LogFormat.damagedDirectory
        else { throw LogError(.invalidArgument, "\"\(name)\" cannot name a side file") }
    }
}
