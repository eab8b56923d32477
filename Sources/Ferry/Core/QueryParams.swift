/// The constraints of a query: order, range and limit. Equal params at the same path share
/// one view.
struct QueryParams: Hashable, Sendable, CustomStringConvertible {
    var index: QueryIndex = .priority
    var limit: Int?
    /// nil: decided by whether a start is set (as the Realtime Database does).
    var viewFromLeft: Bool?
    var startSet = false
    var startValue: Node = .empty
    var startName: String?
    var startAfter = false
    var endSet = false
    var endValue: Node = .empty
    var endName: String?
    var endBefore = false

    static let `default` = QueryParams()

    /// No range and no limit: the view holds everything at the location.
    var loadsAllData: Bool { !(startSet || endSet || limit != nil) }
    /// Loads everything, in the default order.
    var isDefault: Bool { loadsAllData && index == .priority }
    var isViewFromLeft: Bool { viewFromLeft ?? startSet }

    var startPost: NamedNode {
        startSet ? index.makePost(startValue, name: startName ?? KeyOrder.minName) : index.minPost
    }
    var endPost: NamedNode {
        endSet ? index.makePost(endValue, name: endName ?? KeyOrder.maxName) : index.maxPost
    }

    /// What this query shows of `node` (the data at its location): its children in range and
    /// in its window, as the query's views show them.
    func filtered(_ node: Node) -> Node {
        nodeFilter.updateFullNode(IndexedNode(.empty, index: index), IndexedNode(node, index: index), accumulator: nil).node
    }

    var nodeFilter: any NodeFilter {
        if loadsAllData { return IndexedFilter(index: index) }
        if limit != nil { return LimitedFilter(params: self) }
        return RangedFilter(params: self)
    }

    var description: String {
        var parts: [String] = []
        switch index {
        case .priority: break
        case .key: parts.append("orderByKey")
        case .value: parts.append("orderByValue")
        case .child(let p): parts.append("orderByChild(\(p.keys.joined(separator: "/")))")
        }
        if startSet { parts.append("\(startAfter ? "startAfter" : "startAt")(\(startValue.value(export: true))\(startName.map { ", \($0)" } ?? ""))") }
        if endSet { parts.append("\(endBefore ? "endBefore" : "endAt")(\(endValue.value(export: true))\(endName.map { ", \($0)" } ?? ""))") }
        if let limit { parts.append("\(isViewFromLeft ? "limitToFirst" : "limitToLast")(\(limit))") }
        return parts.isEmpty ? "default" : parts.joined(separator: ".")
    }
}

/// A query: a location and its constraints.
struct QuerySpec: Hashable, Sendable, CustomStringConvertible {
    var path: Path
    var params: QueryParams

    static func defaultQuery(at path: Path) -> QuerySpec { QuerySpec(path: path, params: .default) }

    var loadsAllData: Bool { params.loadsAllData }
    var isDefault: Bool { params.isDefault }
    var index: QueryIndex { params.index }

    var description: String { "\(path) \(params)" }
}
