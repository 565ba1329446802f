// The project's Go test programs: the grpc-go CMP client (cmpclient, Argo CD's client stack)
// and the benchmark's floor server (cmpfloor). Their protobuf packages (pluginpb,
// repositorypb) are generated from ../../../proto at build time (build-go-client.sh) by the
// protoc plugins pinned below as tools.
module cmpwarden.test/interop

go 1.26.0

require (
	github.com/golang/protobuf v1.5.4
	google.golang.org/grpc v1.84.0 // as Argo CD v3.5.7 requires it
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2 // indirect
)

tool (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)
