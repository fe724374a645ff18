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
// where a lexeme ends inside a token (llguidance's design); the part of a
// mask that depends on the lexer state alone is cached per state.
package grammar
