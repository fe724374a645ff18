package grammar

// JSONOptions are the choices CompileJSONSchema leaves to the caller.
type JSONOptions struct {
	// FlexibleWhitespace allows whitespace between lexemes; else compact.
	FlexibleWhitespace bool
}

// CompileJSONSchema compiles a JSON Schema. (Being written.)
func CompileJSONSchema(schema []byte, o JSONOptions) (*Grammar, error) {
	return nil, &Error{Keyword: "json_schema", Msg: "not implemented yet"}
}
