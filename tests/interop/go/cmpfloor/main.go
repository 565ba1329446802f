// cmpfloor is the benchmark's floor: a CMP server that does the least any server must do for
// GenerateManifest. It receives the stream on a unix socket as Argo CD's cmp-server does,
// checks the archive's SHA-256 against the metadata, and answers one fixed manifest; it
// extracts nothing and runs nothing. What a real server costs above it is what the server
// itself adds (benches/versus.py). It serves GenerateManifest only.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"hash"
	"io"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "cmpwarden.test/interop/pluginpb"
)

const manifest = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench"}}`

type floor struct {
	pb.UnimplementedConfigManagementPluginServiceServer
}

// receive reads the whole stream and checks its checksum, as every server must before it
// trusts the archive.
func receive(recv func() (*pb.AppStreamRequest, error)) error {
	first, err := recv()
	if err != nil {
		return err
	}
	meta := first.GetMetadata()
	if meta == nil {
		return status.Error(codes.InvalidArgument, "the first message must be the metadata")
	}
	var h hash.Hash = sha256.New()
	for {
		m, err := recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		h.Write(m.GetFile().GetChunk())
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != meta.Checksum {
		return status.Errorf(codes.InvalidArgument, "checksum mismatch: %s != %s", got, meta.Checksum)
	}
	return nil
}

func (floor) GenerateManifest(s pb.ConfigManagementPluginService_GenerateManifestServer) error {
	if err := receive(s.Recv); err != nil {
		return err
	}
	return s.SendAndClose(&pb.ManifestResponse{Manifests: []string{manifest}})
}

func main() {
	socket := flag.String("socket", "", "unix socket to serve on")
	flag.Parse()
	_ = os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := grpc.NewServer(grpc.MaxRecvMsgSize(100*1024*1024), grpc.MaxSendMsgSize(100*1024*1024))
	pb.RegisterConfigManagementPluginServiceServer(s, &floor{})
	if err := s.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
