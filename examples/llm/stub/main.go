// Command stub serves the OpenAI, Anthropic and Gemini APIs as a stand-in
// for the providers (llm/llmtest): answers of a few words that report
// their usage, streamed when asked, so that the LLM example runs without
// provider accounts. Any key is taken.
//
//	go run ./examples/llm/stub -listen 127.0.0.1:8099
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/admitdev/admit/llm/llmtest"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8099", "`address` to serve the providers' APIs on")
	output := flag.Int64("output", 20, "output `tokens` an answer has, when the request's maximum allows")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "stand-in for OpenAI, Anthropic and Gemini on http://%s: set OPENAI_BASE_URL=http://%[1]s/v1, ANTHROPIC_BASE_URL and GOOGLE_GEMINI_BASE_URL=http://%[1]s, any keys\n", ln.Addr())
	srv := &http.Server{Handler: &llmtest.Upstream{Output: *output}, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(ln))
}
