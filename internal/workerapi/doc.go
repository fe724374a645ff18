// Package workerapi is the worker HTTP contract: the paths a worker serves,
// the bodies of its requests and answers, its error body, and the views of
// its /debug/requests page. The router speaks it as a client, the worker as
// a server, and the colocated worker's in-process stream decodes its own
// answers with the same decoder the router uses ([StreamLine.Decode]), so
// the two cannot drift.
//
// # Overview
//
// A request reaches a worker as one leg: POST [PathPrefill], [PathDecode] or
// [PathGenerate] with a [GenerateBody]. Prefill answers once, with a
// [PrefillResult] (after decode acknowledged the KV) or an error; decode and
// colocated legs answer an NDJSON stream of [StreamLine]s whose last line
// carries the finish reason or an error. A leg that fails before its first
// line is an ordinary error answer. Errors keep OpenAI's shape
// {"error":{"message","type","param","code"}} with code = the outcome's name,
// and add two fields: "outcome" (the [outcome.Outcome]) and "cause" (the
// request's first failure, an [outcome.Cause]), so that whoever reads either
// leg's answer first learns the root cause and decides on values, never on
// message text. [PathAbort] ends a leg ([AbortBody]); [PathInfo] describes
// the worker ([Info]).
//
// The package is a leaf of the serving layers: it imports the outcome enum,
// the KV fingerprint, the sampling parameters and the OpenAI error shape,
// and nothing of the worker or the lifecycle machine.
//
// # Concurrency
//
// Types only, and pure functions over them: safe for concurrent use.
//
// # Ownership
//
// Nothing here holds state. The worker owns the meaning of each field it
// serves; the router only reads them.
package workerapi
