// Package grammar constrains decoding: it compiles a constraint (a JSON
// Schema, a regex, a list of choices, a GBNF or Lark grammar) to a Grammar,
// binds it to a model's vocabulary, and gives, at each decoding step, the
// mask of tokens that keep the output valid.
//
// # Model
//
// A Grammar is a context-free grammar whose terminals are lexemes, each a
// Regex over Unicode code points (compiled to bytes as UTF-8). Text is
// lexed greedily, as a classic lexer does: at each point the lexer runs
// every lexeme the parser may accept next at once, and a lexeme ends only
// when the next byte cannot extend any of them (maximal munch) or the text
// ends. Grammars are written so that maximal munch never splits a valid
// text differently from the grammar's intent (JSON's lexemes are strings,
// numbers, literals and punctuation; GBNF's terminals are single
// characters). An optional Skip lexeme (whitespace) may appear between any
// two lexemes and is not seen by the parser.
//
// The parser is Earley's (1970) over lexemes, so any context-free grammar
// works, ambiguous and left-recursive ones included. The lexer is a
// deterministic automaton over bytes whose states are vectors of Brzozowski
// derivatives (1964) of the allowed lexemes, built lazily and shared by
// every matcher of a Constraint. A token mask walks a trie of the
// vocabulary's byte strings against the lexer, consulting the parser only
// where a lexeme ends inside a token (llguidance's design).
//
// # Caches
//
// A full walk of a 128k vocabulary's trie (about 275,000 nodes) costs
// about 1.5 ms, so masks come from caches wherever the result is known:
//
//   - the tokens that stay inside the current lexeme depend on the lexer
//     state alone: a bitset per state, shared by every Constraint of a
//     Vocab under a seeded structural hash of the state's expressions, in
//     which repeat counts beyond the longest token are saturated (no token
//     can tell {0,200} from {0,*}) unless And or Not is involved;
//   - the tokens that end a lexeme inside themselves are grouped by the
//     lexer state and byte where the lexeme ends; each group commits once
//     per mask and its subtrees come from a cache per resulting state,
//     recursively for tokens that end several lexemes;
//   - a state holding complements of finite languages (a JSON key that is
//     none of the object's known names) or finite entries beside an
//     infinite one (known keys partly typed) takes the mask of the same
//     state without them and walks only the trie nodes where the two
//     differ: the finite languages' prefixes.
//
// Bounds per Constraint (expressions, lexer states, Earley items and
// completions per set) make a runaway grammar report ErrTooComplex rather
// than grow without end. Measured on MaskBench: docs/performance.md.
package grammar
