#!/usr/bin/env bash
# Regenerates Sources/FerryFirestoreWire/*.pb.swift and *.grpc.swift from firestore.proto.
# Not part of the build: the generated Swift is committed. Needs Debian's protobuf-compiler and
# libprotobuf-dev, and builds swift-protobuf's and grpc-swift-protobuf's generators (pure Swift)
# from the package mirror into .build-protoc/.
set -euo pipefail
cd "$(dirname "$0")/.."
for pkg in protobuf-compiler libprotobuf-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || apt-get install -y -qq "$pkg" >/dev/null
done
tools=.build-protoc
mkdir -p "$tools"
[ -d "$tools/swift-protobuf" ] || git clone -q -b 1.39.0 https://github.com/apple/swift-protobuf "$tools/swift-protobuf"
[ -d "$tools/grpc-swift-protobuf" ] || git clone -q -b 2.4.1 https://github.com/grpc/grpc-swift-protobuf "$tools/grpc-swift-protobuf"
(cd "$tools/swift-protobuf" && swift build -c release --product protoc-gen-swift)
(cd "$tools/grpc-swift-protobuf" && swift build -c release --product protoc-gen-grpc-swift-2)
out=Sources/FerryFirestoreWire
protoc -I "$out" -I /usr/include \
  --plugin=protoc-gen-swift="$tools/swift-protobuf/.build/release/protoc-gen-swift" \
  --plugin=protoc-gen-grpc-swift-2="$tools/grpc-swift-protobuf/.build/release/protoc-gen-grpc-swift-2" \
  --swift_out="$out" --swift_opt=Visibility=Public \
  --grpc-swift-2_out="$out" --grpc-swift-2_opt=Visibility=Public,Client=true,Server=true \
  "$out/firestore.proto"
echo "generated: $(ls "$out"/*.pb.swift "$out"/*.grpc.swift)"
