//go:build argov2

package main

import "github.com/argoproj/argo-cd/v3/reposerver/apiclient"

// plaintext: the repo-server under test serves without TLS (--disable-tls). v2 keeps the TLS
// settings in the client package itself.
func plaintext() apiclient.TLSConfiguration { return apiclient.TLSConfiguration{DisableTLS: true} }
