#!/usr/bin/env bash
# Build the grpc-go interop client (or, named second, another program of go/src that uses its
# generated code, e.g. cmpfloor) from Debian's packages (GOPATH mode, no module proxy).
# Usage: tests/interop/build-go-client.sh OUT_BINARY [PROGRAM]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
program=${2:-cmpclient}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -r "$here/go/src" "$build/src"
mkdir -p "$build/src/cmpclient/pluginpb" "$build/src/cmpclient/repositorypb"
# grpc-go 1.33 (Debian) marshals through github.com/golang/protobuf 1.3, so generate with the
# matching legacy plugin (/usr/bin/protoc-gen-go, v1.3) and its built-in grpc generator.
map="Mplugin.proto=cmpclient/pluginpb,Mrepository.proto=cmpclient/repositorypb"
protoc -I "$here/../../proto" -I /usr/include \
  --go_out="paths=source_relative,$map:$build/src/cmpclient/repositorypb" repository.proto
protoc -I "$here/../../proto" -I /usr/include \
  --go_out="plugins=grpc,paths=source_relative,$map:$build/src/cmpclient/pluginpb" plugin.proto
cd "$build/src/$program"
GO111MODULE=off GOPATH="$build:/usr/share/gocode" GOCACHE="$build/cache" go build -o "$out" .
