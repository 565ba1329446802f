//go:build argov2

package main

import "github.com/argoproj/argo-cd/v3/reposerver/apiclient"

// tlsConfig: plaintext when the repo-server serves without TLS (--disable-tls), else TLS with
// its own self-signed certificate, unverified, as Argo CD's controller dials it by default.
func tlsConfig(plaintext bool) apiclient.TLSConfiguration {
	return apiclient.TLSConfiguration{DisableTLS: plaintext}
}
