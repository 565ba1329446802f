// Command argo-split reads plugin output exactly as Argo CD does, with Argo CD's own code, so
// that cmp-warden's reading can be compared with it input for input
// (crates/plugin/tests/argo_split.rs, the split_differential fuzz target).
//
// Each input on stdin is a mode byte, a 4-byte big-endian length and that many bytes:
//
//	'm'  a generate command's stdout, one trailing newline trimmed (what the cmp-server's
//	     runCommand returns): split by kube.SplitYAMLToString, as the cmp-server's
//	     generateManifest does;
//	'p'  a dynamic parameters command's stdout, trimmed the same way: json.Unmarshal into
//	     []*apiclient.ParameterAnnouncement, as the cmp-server's getParametersAnnouncement does.
//
// Each answer is one JSON line: {"accepted": true, "manifests": [hex...]} or {"accepted": true,
// "params": [...]} when Argo CD accepts the input, {"accepted": false, "error": hex} with its
// error's text when it refuses it (bytes in hex: a manifest or an error may hold any byte).
// An accepted input whose response gRPC's own codec cannot marshal (a string that is not
// UTF-8) has the codec's error as "marshalError": what the cmp-server's SendAndClose fails on.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/argoproj/argo-cd/v3/cmpserver/apiclient"
	repoclient "github.com/argoproj/argo-cd/v3/reposerver/apiclient"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto"
)

type answer struct {
	Accepted  bool                                `json:"accepted"`
	Manifests []string                            `json:"manifests,omitempty"`
	Params    []*repoclient.ParameterAnnouncement `json:"params,omitempty"`
	Error     string                              `json:"error,omitempty"`
	// MarshalError is gRPC's codec refusing the response of an accepted input.
	MarshalError string `json:"marshalError,omitempty"`
}

func main() {
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for {
		mode, err := in.ReadByte()
		if err == io.EOF {
			return
		}
		var n uint32
		if err == nil {
			err = binary.Read(in, binary.BigEndian, &n)
		}
		buf := make([]byte, n)
		if err == nil {
			_, err = io.ReadFull(in, buf)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "argo-split: reading an input: %v\n", err)
			os.Exit(2)
		}
		var a answer
		switch mode {
		case 'm':
			manifests, err := splitYAMLToString(buf)
			if err != nil {
				a.Error = hex.EncodeToString([]byte(err.Error()))
				break
			}
			a.Accepted = true
			for _, m := range manifests {
				a.Manifests = append(a.Manifests, hex.EncodeToString([]byte(m)))
			}
			a.MarshalError = marshalError(&apiclient.ManifestResponse{Manifests: manifests})
		case 'p':
			var dynamic []*repoclient.ParameterAnnouncement
			if err := json.Unmarshal(buf, &dynamic); err != nil {
				a.Error = hex.EncodeToString([]byte(err.Error()))
				break
			}
			a.Accepted = true
			a.Params = dynamic
			a.MarshalError = marshalError(&apiclient.ParametersAnnouncementResponse{ParameterAnnouncements: dynamic})
		default:
			fmt.Fprintf(os.Stderr, "argo-split: unknown mode %q\n", mode)
			os.Exit(2)
		}
		if err := enc.Encode(a); err != nil {
			fmt.Fprintf(os.Stderr, "argo-split: %v\n", err)
			os.Exit(2)
		}
		if err := out.Flush(); err != nil {
			os.Exit(2)
		}
	}
}

// marshalError is what gRPC's proto codec, which the cmp-server's responses are sent with, says
// of `m` ("" when it marshals). A panic of the marshaler (a nil announcement: `[null]`) is
// reported as "panic: " and its value, which the cmp-server's panic interceptor answers with.
func marshalError(m any) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = hex.EncodeToString([]byte(fmt.Sprintf("panic: %v", r)))
		}
	}()
	if _, err := encoding.GetCodecV2("proto").Marshal(m); err != nil {
		return hex.EncodeToString([]byte(err.Error()))
	}
	return ""
}
