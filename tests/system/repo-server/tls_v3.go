//go:build !argov2

package main

import utiltls "github.com/argoproj/argo-cd/v3/util/tls"

// plaintext: the repo-server under test serves without TLS (--disable-tls).
func plaintext() utiltls.Configuration { return utiltls.Configuration{DisableTLS: true} }
