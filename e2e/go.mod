module github.com/admitdev/admit/e2e

go 1.26.0

require (
	github.com/admitdev/admit v0.0.0-00010101000000-000000000000
	github.com/chromedp/chromedp v0.22.1
	github.com/coder/websocket v1.8.15
)

require (
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
)

replace github.com/admitdev/admit => ../
