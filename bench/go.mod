module github.com/admitdev/admit/bench

go 1.26.0

replace github.com/admitdev/admit => ../

require (
	github.com/admitdev/admit v0.0.0-00010101000000-000000000000
	github.com/sethvargo/go-limiter v0.7.1
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.16.0
)

require github.com/pkg/errors v0.9.1 // indirect
