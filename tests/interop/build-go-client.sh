#!/usr/bin/env bash
# Build the grpc-go interop client (or, named second, another program of go/, e.g. cmpfloor)
# as an ordinary Go module (go/go.mod, go/go.sum: versions pinned, verified) from the module
# proxy, with the machine's Go. Its protobuf packages are generated from proto/ by the protoc
# plugins go.mod pins as tools (protoc itself is Debian's protobuf-compiler).
# Usage: tests/interop/build-go-client.sh OUT_BINARY [PROGRAM]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
program=${2:-cmpclient}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -r "$here/go/." "$build/"
cd "$build"
export GOFLAGS=-mod=readonly
go build -o "$build/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$build/bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
map="Mplugin.proto=cmpwarden.test/interop/pluginpb,Mrepository.proto=cmpwarden.test/interop/repositorypb"
mkdir -p pluginpb repositorypb
PATH="$build/bin:$PATH" protoc -I "$here/../../proto" -I /usr/include \
  --go_out="paths=source_relative,$map:repositorypb" repository.proto
PATH="$build/bin:$PATH" protoc -I "$here/../../proto" -I /usr/include \
  --go_out="paths=source_relative,$map:pluginpb" \
  --go-grpc_out="paths=source_relative,$map:pluginpb" plugin.proto
# gofmt and go vet clean, as every Go file of the project.
unformatted=$(gofmt -l cmpclient cmpfloor)
[ -z "$unformatted" ] || { echo "gofmt: $unformatted" >&2; exit 1; }
go vet ./cmpclient ./cmpfloor
go build -trimpath -o "$out" "./$program"
