// Command wsclient is a WebSocket client for the gateway's walk-through:
// it connects to the URL it is given, sends each line of its standard
// input as a text message, and prints each message it receives, until
// its input ends or the server closes. A refused upgrade prints its
// status and body.
//
//	go run ./examples/wsclient "ws://localhost:8080/v1/ws?tenant=tenant-1&session=…"
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/coder/websocket"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: wsclient ws://host:port/v1/ws?tenant=…&session=…")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1], os.Stdin, os.Stdout))
}

func run(ctx context.Context, url string, in io.Reader, out io.Writer) int {
	c, resp, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			fmt.Fprintf(out, "refused: %s %s\n", resp.Status, body)
			return 1
		}
		fmt.Fprintln(out, err)
		return 1
	}
	defer c.CloseNow()
	done, got := make(chan struct{}), make(chan struct{}, 1)
	go func() {
		defer close(done)
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				if s := websocket.CloseStatus(err); s != websocket.StatusNormalClosure {
					fmt.Fprintf(out, "closed: %v\n", err)
				}
				return
			}
			fmt.Fprintf(out, "%s\n", msg)
			select {
			case got <- struct{}{}:
			default:
			}
		}
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if err := c.Write(ctx, websocket.MessageText, sc.Bytes()); err != nil {
			break
		}
	}
	// Standard input ended: the answers to what was sent may still be on
	// their way. Wait for a second without one, then close.
	for {
		select {
		case <-done:
			return 0
		case <-got:
			continue
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		break
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
	<-done
	return 0
}
