module github.com/gorun/gorun

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-0
	github.com/creack/pty v1.1.24
	github.com/ebitengine/purego v0.11.3
	github.com/kevinburke/ssh_config v1.6.0
	github.com/rs/zerolog v1.35.1
	github.com/urfave/cli/v2 v2.27.7
	golang.org/x/crypto v0.58.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/cpuguy83/go-md2man/v2 v2.0.7 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
)
