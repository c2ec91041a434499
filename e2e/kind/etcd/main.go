// etcd's server built from its module (the release's root module has replace directives, so
// `go install go.etcd.io/etcd/v3` cannot be used); the same entry point as the release binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
