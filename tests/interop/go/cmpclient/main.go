// cmpclient dials a CMP plugin socket exactly as Argo CD's repo-server does and calls one RPC.
//
// Packing mirrors util/io/files/tar.go (Tgz): filepath.Walk, tar.FileInfoHeader, names relative
// to the root ("." for the root), no trailing slash on directories, Go's archive/tar writer,
// compress/gzip default level. The dial mirrors util/grpc BlockingDial: the socket path is the
// dial target and a custom unix dialer connects, so grpc-go derives :authority from the path.
// -authority overrides it to reproduce the percent-encoded forms of newer grpc-go releases.
package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang/protobuf/jsonpb"
	"github.com/golang/protobuf/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	pb "cmpwarden.test/interop/pluginpb"
)

type envList []string

func (e *envList) String() string     { return strings.Join(*e, ",") }
func (e *envList) Set(v string) error { *e = append(*e, v); return nil }

// tgz packs root as the repo-server does; a non-nil nonce adds one more file holding it (the
// benchmark's "a new archive every request").
func tgz(root string, w io.Writer, exclude []string, nonce []byte) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	files := 0
	err := filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		for _, ex := range exclude {
			if ok, _ := filepath.Match(ex, rel); ok {
				if fi.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		mode := fi.Mode()
		if !(mode.IsRegular() || mode.IsDir() || mode&os.ModeSymlink != 0) {
			return nil
		}
		link := ""
		if mode&os.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if mode.IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
			files++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if files == 0 {
		return fmt.Errorf("no files to send(%s)", root)
	}
	if nonce != nil {
		hdr := &tar.Header{Name: ".bench-nonce", Mode: 0o644, Size: int64(len(nonce)), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(nonce); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func fail(err error) {
	st, _ := status.FromError(err)
	out, _ := json.Marshal(map[string]interface{}{"code": int(st.Code()), "message": st.Message()})
	fmt.Println(string(out))
	os.Exit(3)
}

func main() {
	socket := flag.String("socket", "", "plugin socket path")
	rpc := flag.String("rpc", "check", "check|match|generate|params")
	dir := flag.String("dir", "", "repository root to pack")
	tgzFile := flag.String("tgz", "", "send this archive instead of packing -dir")
	appRel := flag.String("app-rel-path", ".", "appRelPath")
	appName := flag.String("app", "", "application name (default: the app path's base name)")
	authority := flag.String("authority", "", "override :authority (encoded forms)")
	chunk := flag.Int("chunk", 1024, "chunk size")
	chunkDelay := flag.Duration("chunk-delay", 0, "pause before each chunk (a slow client)")
	stallAfter := flag.Int("stall-after", -1, "after this many chunks, pause for -stall once (a client that stalls mid-archive)")
	stall := flag.Duration("stall", 0, "the pause of -stall-after")
	timeout := flag.Duration("timeout", 30*time.Second, "request deadline")
	checksum := flag.String("checksum", "", "override the checksum sent")
	var env envList
	flag.Var(&env, "env", "NAME=VALUE (repeatable)")
	envFlood := flag.Int("env-flood", 0, "add this many distinct ARGOCD_ENV_FLOOD_<i> entries (an environment flood)")
	var exclude envList
	flag.Var(&exclude, "exclude", "glob (repeatable)")
	address := flag.String("address", "", "dial HOST:PORT over TCP instead of -socket (plugins as services)")
	tlsCA := flag.String("tls-ca", "", "with -address: TLS, trusting this CA bundle")
	tlsCert := flag.String("tls-cert", "", "with -tls-ca: client certificate (mutual TLS)")
	tlsKey := flag.String("tls-key", "", "key of -tls-cert")
	token := flag.String("token", "", "bearer token sent as authorization metadata")
	traceparent := flag.String("traceparent", "", "W3C traceparent sent as metadata (the caller's span)")
	requests := flag.Int("requests", 0, "load: this many generate calls, each as the repo-server makes one (JSON of their times)")
	concurrency := flag.Int("concurrency", 1, "load: calls at once")
	vary := flag.Bool("vary", false, "load: a new archive every call (one more small file)")
	flag.Parse()

	opts := []grpc.DialOption{
		grpc.WithBlock(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(100*1024*1024), grpc.MaxCallSendMsgSize(100*1024*1024)),
	}
	target := *socket
	if *address != "" {
		target = *address
		if *tlsCA != "" {
			pem, err := os.ReadFile(*tlsCA)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
			if *tlsCert != "" {
				pair, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				cfg.Certificates = []tls.Certificate{pair}
			}
			opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		} else {
			opts = append(opts, grpc.WithInsecure())
		}
	} else {
		opts = append(opts, grpc.WithInsecure(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}))
	}
	if *authority != "" {
		opts = append(opts, grpc.WithAuthority(*authority))
	}
	if *requests > 0 {
		load(target, opts, *dir, *requests, *concurrency, *vary, *chunk, *timeout)
		return
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	conn, err := grpc.DialContext(dctx, target, opts...)
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := pb.NewConfigManagementPluginServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if *token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+*token)
	}
	if *traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", *traceparent)
	}
	var resp proto.Message
	if *rpc == "check" {
		r, err := client.CheckPluginConfiguration(ctx, &emptypb.Empty{})
		if err != nil {
			fail(err)
		}
		resp = r
	} else {
		var data []byte
		if *tgzFile != "" {
			data, err = os.ReadFile(*tgzFile)
		} else {
			var buf strings.Builder
			err = tgz(*dir, &buf, exclude, nil)
			data = []byte(buf.String())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		sum := sha256.Sum256(data)
		cs := hex.EncodeToString(sum[:])
		if *checksum != "" {
			cs = *checksum
		}
		var entries []*pb.EnvEntry
		for _, e := range env {
			kv := strings.SplitN(e, "=", 2)
			if len(kv) == 2 {
				entries = append(entries, &pb.EnvEntry{Name: kv[0], Value: kv[1]})
			}
		}
		for i := 0; i < *envFlood; i++ {
			entries = append(entries, &pb.EnvEntry{Name: fmt.Sprintf("ARGOCD_ENV_FLOOD_%d", i), Value: "xxxxxxxx"})
		}
		appPath := filepath.Join(*dir, *appRel)
		name := filepath.Base(appPath)
		if *appName != "" {
			name = *appName
		}
		meta := &pb.AppStreamRequest{Request: &pb.AppStreamRequest_Metadata{Metadata: &pb.ManifestRequestMetadata{
			AppName: name, AppRelPath: *appRel, Checksum: cs, Size: int64(len(data)), Env: entries}}}
		// The reply is awaited while sending (grpc-go allows one goroutine in SendMsg and one
		// in RecvMsg), so a client pausing mid-archive learns at once that the server ended
		// its stream instead of sleeping out its pause.
		call := func(s grpc.ClientStream, out proto.Message) {
			errc := make(chan error, 1)
			ended := make(chan struct{})
			go func() {
				errc <- s.RecvMsg(out)
				close(ended)
			}()
			sendAll := func() {
				if err := s.SendMsg(meta); err != nil {
					return // io.EOF: the server already answered; RecvMsg reports its status
				}
				for i, off := 0, 0; off < len(data); i, off = i+1, off+*chunk {
					end := off + *chunk
					if end > len(data) {
						end = len(data)
					}
					pause := *chunkDelay
					if i == *stallAfter {
						pause += *stall
					}
					select {
					case <-time.After(pause):
					case <-ended:
						return
					}
					if err := s.SendMsg(&pb.AppStreamRequest{Request: &pb.AppStreamRequest_File{File: &pb.File{Chunk: data[off:end]}}}); err != nil {
						return // the server answered early; RecvMsg reports it
					}
				}
			}
			sendAll()
			_ = s.CloseSend()
			if err := <-errc; err != nil {
				fail(err)
			}
			resp = out
		}
		switch *rpc {
		case "generate":
			s, err := client.GenerateManifest(ctx)
			if err != nil {
				fail(err)
			}
			call(s, new(pb.ManifestResponse))
		case "match":
			s, err := client.MatchRepository(ctx)
			if err != nil {
				fail(err)
			}
			call(s, new(pb.RepositoryResponse))
		case "params":
			s, err := client.GetParametersAnnouncement(ctx)
			if err != nil {
				fail(err)
			}
			call(s, new(pb.ParametersAnnouncementResponse))
		default:
			fmt.Fprintln(os.Stderr, "unknown rpc", *rpc)
			os.Exit(2)
		}
	}
	out, err := (&jsonpb.Marshaler{EmitDefaults: true}).MarshalToString(resp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(out)
}

// load runs GenerateManifest n times, c at once, each as the repo-server makes one: a new
// connection, the repository packed, streamed in chunks, the reply awaited. It prints one JSON
// object: each successful call's milliseconds (packing included), the errors, the wall time.
func load(target string, opts []grpc.DialOption, dir string, n, c int, vary bool, chunk int, timeout time.Duration) {
	type result struct {
		ms  float64
		err error
	}
	jobs := make(chan int)
	results := make(chan result)
	for w := 0; w < c; w++ {
		go func() {
			for i := range jobs {
				start := time.Now()
				err := generateOnce(target, opts, dir, i, vary, chunk, timeout)
				results <- result{float64(time.Since(start).Microseconds()) / 1000, err}
			}
		}()
	}
	go func() {
		for i := 0; i < n; i++ {
			jobs <- i
		}
		close(jobs)
	}()
	ms, errs := []float64{}, []string{}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err.Error())
		} else {
			ms = append(ms, r.ms)
		}
	}
	out, _ := json.Marshal(map[string]interface{}{"ms": ms, "errors": errs, "wallS": time.Since(t0).Seconds()})
	fmt.Println(string(out))
}

func generateOnce(target string, opts []grpc.DialOption, dir string, i int, vary bool, chunk int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, target, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	var nonce []byte
	if vary {
		nonce = []byte(fmt.Sprintf("%d-%d-%d\n", os.Getpid(), time.Now().UnixNano(), i))
	}
	var buf strings.Builder
	if err := tgz(dir, &buf, nil, nonce); err != nil {
		return err
	}
	data := []byte(buf.String())
	sum := sha256.Sum256(data)
	s, err := pb.NewConfigManagementPluginServiceClient(conn).GenerateManifest(ctx)
	if err != nil {
		return err
	}
	meta := &pb.ManifestRequestMetadata{AppName: filepath.Base(dir), AppRelPath: ".",
		Checksum: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	if err := s.Send(&pb.AppStreamRequest{Request: &pb.AppStreamRequest_Metadata{Metadata: meta}}); err != nil {
		return err
	}
	for off := 0; off < len(data); off += chunk {
		end := off + chunk
		if end > len(data) {
			end = len(data)
		}
		if err := s.Send(&pb.AppStreamRequest{Request: &pb.AppStreamRequest_File{File: &pb.File{Chunk: data[off:end]}}}); err != nil {
			break // the server answered early; CloseAndRecv reports it
		}
	}
	resp, err := s.CloseAndRecv()
	if err != nil {
		return err
	}
	if len(resp.Manifests) == 0 {
		return fmt.Errorf("no manifests")
	}
	return nil
}
