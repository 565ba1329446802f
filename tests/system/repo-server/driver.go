// repo-server-driver calls Argo CD's repo-server through Argo CD's own client package
// (reposerver/apiclient), as the application controller and the API server do, and prints the
// answer as JSON. scripts/argo-build --driver compiles it inside the module that builds the
// repo-server itself, against the same release (import paths rewritten for v2), so the wire
// types are that release's.
//
//	repo-server-driver -address HOST:PORT [-tls] -rpc generate|details|resolve -request JSON
//
// The request JSON: {"repo": URL, "username", "password", "path", "revision", "appName",
// "namespace", "project", "kubeVersion", "apiVersions": [...], "noCache": bool,
// "traceparent": W3C value sent as metadata, "plugin": {"name", "env": {K: V},
// "parameters": [{"name", "string", "map": {}, "array": []}]} (absent: discovery)}.
// The answer: {"ok", "code", "error", "manifests", "sourceType", "revision", "details",
// "ms"}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/reposerver/apiclient"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type param struct {
	Name   string            `json:"name"`
	String *string           `json:"string,omitempty"`
	Map    map[string]string `json:"map,omitempty"`
	Array  []string          `json:"array,omitempty"`
}

type pluginSpec struct {
	Name       string            `json:"name"`
	Env        map[string]string `json:"env"`
	Parameters []param           `json:"parameters"`
}

type request struct {
	Repo        string      `json:"repo"`
	Username    string      `json:"username"`
	Password    string      `json:"password"`
	Path        string      `json:"path"`
	Revision    string      `json:"revision"`
	AppName     string      `json:"appName"`
	Namespace   string      `json:"namespace"`
	Project     string      `json:"project"`
	KubeVersion string      `json:"kubeVersion"`
	APIVersions []string    `json:"apiVersions"`
	NoCache     bool        `json:"noCache"`
	Traceparent string      `json:"traceparent"`
	Plugin      *pluginSpec `json:"plugin"`
}

type answer struct {
	OK         bool            `json:"ok"`
	Code       string          `json:"code,omitempty"`
	Error      string          `json:"error,omitempty"`
	Manifests  []string        `json:"manifests,omitempty"`
	SourceType string          `json:"sourceType,omitempty"`
	Revision   string          `json:"revision,omitempty"`
	Details    json.RawMessage `json:"details,omitempty"`
	Ms         int64           `json:"ms"`
}

func (r *request) source() *v1alpha1.ApplicationSource {
	src := &v1alpha1.ApplicationSource{RepoURL: r.Repo, Path: r.Path, TargetRevision: r.Revision}
	if r.Plugin != nil {
		p := &v1alpha1.ApplicationSourcePlugin{Name: r.Plugin.Name}
		keys := make([]string, 0, len(r.Plugin.Env))
		for k := range r.Plugin.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p.Env = append(p.Env, &v1alpha1.EnvEntry{Name: k, Value: r.Plugin.Env[k]})
		}
		for _, prm := range r.Plugin.Parameters {
			q := v1alpha1.ApplicationSourcePluginParameter{Name: prm.Name, String_: prm.String}
			if prm.Map != nil {
				q.OptionalMap = &v1alpha1.OptionalMap{Map: prm.Map}
			}
			if prm.Array != nil {
				q.OptionalArray = &v1alpha1.OptionalArray{Array: prm.Array}
			}
			p.Parameters = append(p.Parameters, q)
		}
		src.Plugin = p
	}
	return src
}

func (r *request) repository() *v1alpha1.Repository {
	return &v1alpha1.Repository{Repo: r.Repo, Username: r.Username, Password: r.Password, Type: "git"}
}

func main() {
	address := flag.String("address", "127.0.0.1:8081", "repo-server address")
	rpc := flag.String("rpc", "generate", "generate|details|resolve")
	raw := flag.String("request", "{}", "request JSON")
	timeout := flag.Duration("timeout", 60*time.Second, "the caller's deadline (the controller's is 60 s)")
	useTLS := flag.Bool("tls", false, "TLS, the repo-server's own certificate unverified (as the controller's default)")
	flag.Parse()
	var r request
	if err := json.Unmarshal([]byte(*raw), &r); err != nil {
		fmt.Fprintln(os.Stderr, "request:", err)
		os.Exit(2)
	}
	cs := apiclient.NewRepoServerClientset(*address, int(timeout.Seconds()), tlsConfig(!*useTLS))
	closer, c, err := cs.NewRepoServerClient()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(2)
	}
	defer closer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if r.Traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", r.Traceparent)
	}
	var out answer
	started := time.Now()
	switch *rpc {
	case "generate":
		res, err := c.GenerateManifest(ctx, &apiclient.ManifestRequest{
			Repo:               r.repository(),
			Revision:           r.Revision,
			AppName:            r.AppName,
			Namespace:          r.Namespace,
			ProjectName:        r.Project,
			ProjectSourceRepos: []string{"*"},
			KubeVersion:        r.KubeVersion,
			ApiVersions:        r.APIVersions,
			NoCache:            r.NoCache,
			NoRevisionCache:    r.NoCache,
			ApplicationSource:  r.source(),
		})
		if err == nil {
			out.Manifests, out.SourceType, out.Revision = res.Manifests, res.SourceType, res.Revision
		}
		out.fail(err)
	case "details":
		res, err := c.GetAppDetails(ctx, &apiclient.RepoServerAppDetailsQuery{
			Repo:    r.repository(),
			Source:  r.source(),
			AppName: r.AppName,
			NoCache: r.NoCache,
		})
		if err == nil {
			out.SourceType = res.Type
			out.Details, _ = json.Marshal(res)
		}
		out.fail(err)
	case "resolve":
		app := &v1alpha1.Application{Spec: v1alpha1.ApplicationSpec{Source: r.source()}}
		app.Name = r.AppName
		res, err := c.ResolveRevision(ctx, &apiclient.ResolveRevisionRequest{
			Repo:              r.repository(),
			App:               app,
			AmbiguousRevision: r.Revision,
		})
		if err == nil {
			out.Revision = res.Revision
		}
		out.fail(err)
	default:
		fmt.Fprintln(os.Stderr, "unknown -rpc", *rpc)
		os.Exit(2)
	}
	out.Ms = time.Since(started).Milliseconds()
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		os.Exit(1)
	}
}

func (a *answer) fail(err error) {
	a.OK = err == nil
	if err != nil {
		st, _ := status.FromError(err)
		a.Code, a.Error = st.Code().String(), st.Message()
	}
}
