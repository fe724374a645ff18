package grammar

// CompileGBNF compiles a llama.cpp GBNF grammar. (Being written.)
func CompileGBNF(src string) (*Grammar, error) {
	return nil, &Error{Keyword: "gbnf", Msg: "not implemented yet"}
}

// CompileLark compiles a Lark grammar. (Being written.)
func CompileLark(src string) (*Grammar, error) {
	return nil, &Error{Keyword: "lark", Msg: "not implemented yet"}
}
