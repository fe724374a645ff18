// Package openai is pdserve's OpenAI-compatible front end: the wire types of
// /v1/completions, /v1/chat/completions and /v1/models, their validation into
// internal generation requests, the OpenAI error shape, Server-Sent Events
// framing, and an http.Handler that runs requests on an Engine.
//
// # Overview
//
// The same handler serves the PD router and a colocated worker; only the
// Engine differs. The handler parses and validates a request (wire types are
// plain structs; converters to the internal request are pure functions),
// tokenizes the prompt once, mints the request id, and calls
// Engine.Generate. It then reads the Stream, detokenizes the output
// incrementally, applies stop strings (which the engine does not know), and
// answers the client with one JSON body or an SSE stream. EOS, stop token ids
// and max_tokens are enforced by the engine.
//
// # Concurrency
//
// A Handler is safe for concurrent use; it holds no mutable state. Each HTTP
// request is served entirely on its own goroutine: the handler calls
// Stream.Recv, Stream.Stop and Stream.Close from that goroutine only, never
// concurrently. Engines must make Recv return promptly once the context given
// to Generate is done (the client went away).
//
// # Ownership
//
// After a successful Engine.Generate the handler owns the Stream and calls
// Close exactly once, on every path (success, stop string, client gone,
// error). It calls Stop at most once, before Close, when it ended the request
// itself because a stop string matched; a request that was neither finished
// by the engine nor stopped is aborted by Close. The GenerateRequest and its
// slices are not modified by the handler after Generate is called.
package openai
