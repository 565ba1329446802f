// The `argocd` multi-call binary these tests run: Argo CD's own command packages for the three
// programs they start (the repo-server, the cmp-server and the git askpass helper its git
// calls run), dispatched by name as the release's cmd/main.go dispatches them. The release's
// main also links the API server, the controllers, the CLI, dex and notifications, which no
// test runs and which were a third of a fresh machine's Argo CD build. scripts/argo-build
// compiles this inside the module that builds the release (import paths rewritten for v2).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	cmpserver "github.com/argoproj/argo-cd/v3/cmd/argocd-cmp-server/commands"
	gitaskpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
)

// As the release's main: the name it runs as, unless ARGOCD_BINARY_NAME says otherwise (the
// repo-server sets it for git's askpass calls of `argocd`).
const binaryNameEnv = "ARGOCD_BINARY_NAME"

func main() {
	binaryName := filepath.Base(os.Args[0])
	if val := os.Getenv(binaryNameEnv); val != "" {
		binaryName = val
	}
	var command *cobra.Command
	isCLI := false
	switch binaryName {
	case "argocd-repo-server":
		command = reposerver.NewCommand()
	case "argocd-cmp-server":
		command = cmpserver.NewCommand()
		isCLI = true
	case "argocd-git-ask-pass":
		command = gitaskpass.NewCommand()
		isCLI = true
	default:
		fmt.Fprintf(os.Stderr, "this argocd (cmp-warden's test build) runs as argocd-repo-server, "+
			"argocd-cmp-server or argocd-git-ask-pass, not %q\n", binaryName)
		os.Exit(2)
	}
	silenced := setup(isCLI)
	if silenced {
		command.SilenceErrors = true
		command.SilenceUsage = true
	}
	if err := command.Execute(); err != nil {
		if silenced {
			fmt.Printf("Error: %v\n", err)
		}
		os.Exit(1)
	}
}
