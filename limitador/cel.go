package limitador

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
	celparser "cel.dev/cel-go/parser"
)

// The names CEL sees.
const (
	varDescriptors = "descriptors"
	varLimit       = "limit"
)

// MaxExpressionCost bounds what evaluating one condition or variable may
// cost, in CEL's cost units (about one per value visited): a request's
// descriptors are the caller's, and a macro over them must not run
// without end.
const MaxExpressionCost = 100_000

// celEnv is the environment every expression is compiled in. Expressions
// are parsed, not type-checked, as Limitador's CEL is dynamic: a
// comparison of a string with a number is false, not an error at load.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable(varDescriptors, cel.ListType(cel.MapType(cel.StringType, cel.StringType))),
		cel.Variable(varLimit, cel.MapType(cel.StringType, cel.DynType)),
		limitadorFunctions(),
	)
})

// limitadorFunctions declares the functions Limitador's CEL (the cel
// crate) has beside the standard ones: contains on a list (an element), a
// map (a key) and bytes, and max and min of numbers, or of a list.
func limitadorFunctions() cel.EnvOption {
	contains := func(c, x ref.Val) ref.Val {
		if cn, ok := c.(traits.Container); ok {
			return cn.Contains(x)
		}
		return types.MaybeNoSuchOverloadErr(c)
	}
	extreme := func(name string, want types.Int) cel.EnvOption {
		pick := func(args ...ref.Val) ref.Val {
			if len(args) == 1 {
				l, ok := args[0].(traits.Lister)
				if !ok {
					return args[0]
				}
				n := int(l.Size().(types.Int))
				args = make([]ref.Val, n)
				for i := range n {
					args[i] = l.Get(types.Int(i))
				}
			}
			if len(args) == 0 {
				return types.NullValue // Limitador's max() and max([])
			}
			best := args[0]
			for _, a := range args[1:] {
				cmp, ok := a.(traits.Comparer)
				if !ok {
					return types.MaybeNoSuchOverloadErr(a)
				}
				c := cmp.Compare(best)
				if types.IsError(c) {
					return c
				}
				if c == want {
					best = a
				}
			}
			return best
		}
		// max(a, b, c) of any number of arguments is read as max([a, b, c]),
		// one overload of one argument.
		spread := cel.GlobalVarArgMacro(name, func(eh celparser.ExprHelper, _ ast.Expr, args []ast.Expr) (ast.Expr, *common.Error) {
			if len(args) == 1 {
				return nil, nil
			}
			return eh.NewCall(name, eh.NewList(args...)), nil
		})
		return cel.Lib(&extraLib{opts: []cel.EnvOption{
			cel.Macros(spread),
			cel.Function(name, cel.Overload(name+"_1", []*cel.Type{cel.DynType}, cel.DynType, cel.UnaryBinding(func(v ref.Val) ref.Val { return pick(v) }))),
		}})
	}
	return cel.Lib(&extraLib{opts: []cel.EnvOption{
		cel.Function("contains",
			cel.MemberOverload("list_contains", []*cel.Type{cel.ListType(cel.DynType), cel.DynType}, cel.BoolType, cel.BinaryBinding(contains)),
			cel.MemberOverload("map_contains", []*cel.Type{cel.MapType(cel.DynType, cel.DynType), cel.DynType}, cel.BoolType, cel.BinaryBinding(contains)),
			cel.MemberOverload("bytes_contains", []*cel.Type{cel.BytesType, cel.BytesType}, cel.BoolType, cel.BinaryBinding(func(b, x ref.Val) ref.Val {
				bb, ok1 := b.(types.Bytes)
				xb, ok2 := x.(types.Bytes)
				if !ok1 || !ok2 {
					return types.MaybeNoSuchOverloadErr(x)
				}
				return types.Bool(bytes.Contains(bb, xb))
			}))),
		extreme("max", 1),
		extreme("min", -1),
	}})
}

// extraLib is a cel.Library of env options.
type extraLib struct{ opts []cel.EnvOption }

func (l *extraLib) CompileOptions() []cel.EnvOption     { return l.opts }
func (l *extraLib) ProgramOptions() []cel.ProgramOption { return nil }

// expr is one compiled condition or variable.
type expr struct {
	source string
	prg    cel.Program
	// free are the identifiers it reads from the context (not those a
	// comprehension binds).
	free []string
	// entry, when set, is the expression read without CEL: it is one of
	// the forms Kuadrant writes, an entry of a descriptor, compared with a
	// string or not (see entryForm).
	entry *entryForm
}

// entryForm is an expression of the form descriptors[N]['key'], or that
// compared (== or !=) with a string literal: Kuadrant's conditions and
// variables. It reads as CEL reads it — a missing descriptor or entry is
// missing — with no evaluation, no allocation and no error built for the
// entries a request lacks, which are most of them (each limit of a
// route's namespace tests an entry of its own).
type entryForm struct {
	index int64
	key   string
	op    string // "" (the entry's value), "==" or "!="
	value string
}

// entryOf recognizes the entry forms in e.
func entryOf(e ast.Expr) *entryForm {
	read := func(e ast.Expr) *entryForm {
		var operand ast.Expr
		var key string
		switch e.Kind() {
		case ast.SelectKind:
			s := e.AsSelect()
			if s.IsTestOnly() {
				return nil
			}
			operand, key = s.Operand(), s.FieldName()
		case ast.CallKind:
			c := e.AsCall()
			if c.FunctionName() != operators.Index || len(c.Args()) != 2 || c.Args()[1].Kind() != ast.LiteralKind {
				return nil
			}
			k, ok := c.Args()[1].AsLiteral().(types.String)
			if !ok {
				return nil
			}
			operand, key = c.Args()[0], string(k)
		default:
			return nil
		}
		if operand.Kind() != ast.CallKind {
			return nil
		}
		c := operand.AsCall()
		if c.FunctionName() != operators.Index || len(c.Args()) != 2 || c.Args()[0].Kind() != ast.IdentKind ||
			c.Args()[0].AsIdent() != varDescriptors || c.Args()[1].Kind() != ast.LiteralKind {
			return nil
		}
		n, ok := c.Args()[1].AsLiteral().(types.Int)
		if !ok {
			return nil
		}
		return &entryForm{index: int64(n), key: key}
	}
	if f := read(e); f != nil {
		return f
	}
	if e.Kind() != ast.CallKind {
		return nil
	}
	c := e.AsCall()
	op := map[string]string{operators.Equals: "==", operators.NotEquals: "!="}[c.FunctionName()]
	if op == "" || len(c.Args()) != 2 {
		return nil
	}
	for i := range 2 {
		f, lit := read(c.Args()[i]), c.Args()[1-i]
		if f == nil || lit.Kind() != ast.LiteralKind {
			continue
		}
		if v, ok := lit.AsLiteral().(types.String); ok {
			f.op, f.value = op, string(v)
			return f
		}
	}
	return nil
}

// lookup reads f's entry of descriptors.
func (f *entryForm) lookup(descriptors []map[string]string) (string, bool) {
	if f.index < 0 || f.index >= int64(len(descriptors)) {
		return "", false
	}
	v, ok := descriptors[f.index][f.key]
	return v, ok
}

// compile parses source as a CEL expression.
func compile(source string) (*expr, error) {
	env, err := celEnv()
	if err != nil {
		return nil, err
	}
	a, iss := env.Parse(source)
	if iss != nil && iss.Err() != nil {
		// The first problem, on one line: where it is, and what.
		errs := iss.Errors()
		if len(errs) == 0 {
			return nil, iss.Err()
		}
		e := errs[0]
		return nil, fmt.Errorf("at column %d: %s", e.Location.Column()+1, e.Message)
	}
	root := a.NativeRep().Expr()
	// Only a comprehension loops; without one an expression's cost is
	// bounded by its size and its inputs', and tracking it would cost more
	// than the evaluation.
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if loops(root) {
		opts = append(opts, cel.CostLimit(MaxExpressionCost))
	}
	prg, err := env.Program(a, opts...)
	if err != nil {
		return nil, err
	}
	e := &expr{source: source, prg: prg, entry: entryOf(root)}
	freeIdents(root, nil, &e.free)
	return e, nil
}

// loops reports whether e holds a comprehension (a macro: all, exists,
// map, filter).
func loops(e ast.Expr) bool {
	found := false
	ast.PostOrderVisit(e, ast.NewExprVisitor(func(x ast.Expr) {
		found = found || x.Kind() == ast.ComprehensionKind
	}))
	return found
}

// freeIdents appends to out the identifiers e reads that no enclosing
// comprehension of e binds.
func freeIdents(e ast.Expr, bound []string, out *[]string) {
	add := func(name string) {
		for _, b := range bound {
			if b == name {
				return
			}
		}
		for _, o := range *out {
			if o == name {
				return
			}
		}
		*out = append(*out, name)
	}
	switch e.Kind() {
	case ast.IdentKind:
		add(e.AsIdent())
	case ast.SelectKind:
		freeIdents(e.AsSelect().Operand(), bound, out)
	case ast.CallKind:
		c := e.AsCall()
		if c.IsMemberFunction() {
			freeIdents(c.Target(), bound, out)
		}
		for _, a := range c.Args() {
			freeIdents(a, bound, out)
		}
	case ast.ListKind:
		for _, el := range e.AsList().Elements() {
			freeIdents(el, bound, out)
		}
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			m := en.AsMapEntry()
			freeIdents(m.Key(), bound, out)
			freeIdents(m.Value(), bound, out)
		}
	case ast.StructKind:
		for _, f := range e.AsStruct().Fields() {
			freeIdents(f.AsStructField().Value(), bound, out)
		}
	case ast.ComprehensionKind:
		c := e.AsComprehension()
		freeIdents(c.IterRange(), bound, out)
		freeIdents(c.AccuInit(), bound, out)
		inner := append(append([]string{}, bound...), c.IterVar(), c.AccuVar())
		if c.HasIterVar2() {
			inner = append(inner, c.IterVar2())
		}
		freeIdents(c.LoopCondition(), inner, out)
		freeIdents(c.LoopStep(), inner, out)
		freeIdents(c.Result(), append(append([]string{}, bound...), c.AccuVar()), out)
	}
}

// reads reports whether every identifier e reads is one of names.
func (e *expr) reads(names ...string) bool {
	for _, f := range e.free {
		found := false
		for _, n := range names {
			found = found || f == n
		}
		if !found {
			return false
		}
	}
	return true
}

// errMissing is an expression's reading of an entry or a descriptor the
// request does not have: the limit does not apply.
var errMissing = errors.New("missing")

// eval evaluates e in act.
func (e *expr) eval(act interpreter.Activation) (ref.Val, error) {
	v, _, err := e.prg.Eval(act)
	if err != nil {
		msg := err.Error()
		if strings.HasPrefix(msg, "no such key") || strings.Contains(msg, "out of range") || strings.Contains(msg, "out of bounds") {
			return nil, errMissing
		}
		return nil, err
	}
	return v, nil
}

// test evaluates e as a condition: a missing entry makes it false, as a
// result that is not a bool is an error.
func (e *expr) test(req *request) (bool, error) {
	if f := e.entry; f != nil && f.op != "" {
		v, ok := f.lookup(req.raw)
		return ok && (v == f.value) == (f.op == "=="), nil
	}
	if !e.reads(varDescriptors, varLimit) {
		return false, nil // it reads what the request has not: Limitador's false
	}
	v, err := e.eval(req)
	if err == errMissing {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, fmt.Errorf("evaluates to %s, not a bool", describe(v))
	}
	return bool(b), nil
}

// value evaluates e as a variable: its value as Limitador writes it, or
// ok false when it reads a missing entry (the limit does not apply).
func (e *expr) value(req *request) (s string, ok bool, err error) {
	if f := e.entry; f != nil && f.op == "" {
		s, ok := f.lookup(req.raw)
		return s, ok, nil
	}
	v, err := e.eval(req)
	if err == errMissing {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	switch x := v.(type) {
	case types.String:
		return string(x), true, nil
	case types.Int:
		return strconv.FormatInt(int64(x), 10), true, nil
	case types.Uint:
		return strconv.FormatUint(uint64(x), 10), true, nil
	case types.Double:
		return formatFloat(float64(x)), true, nil
	case types.Bool:
		return strconv.FormatBool(bool(x)), true, nil
	case types.Null:
		return "null", true, nil
	}
	return "", false, fmt.Errorf("evaluates to %s; a variable is a string, a number, a bool or null", describe(v))
}

// formatFloat writes f as Rust's f64 Display does, which is how Limitador
// writes a variable's double: the shortest digits that read back as f,
// never an exponent, and no fraction for a whole number ("2", "0.5").
func formatFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func describe(v ref.Val) string {
	return "a " + strings.ToLower(v.Type().TypeName())
}

// request is the CEL context of one request: its descriptors, bound the
// first time an expression reads them through CEL, and the limit being
// evaluated, set before each limit's expressions.
type request struct {
	raw         []map[string]string
	descriptors ref.Val
	limit       ref.Val
}

var _ interpreter.Activation = (*request)(nil)

// ResolveName implements interpreter.Activation.
func (r *request) ResolveName(name string) (any, bool) {
	switch name {
	case varDescriptors:
		if r.descriptors == nil {
			elems := make([]ref.Val, len(r.raw))
			for i, d := range r.raw {
				elems[i] = types.NewStringStringMap(types.DefaultTypeAdapter, d)
			}
			r.descriptors = types.NewRefValList(types.DefaultTypeAdapter, elems)
		}
		return r.descriptors, true
	case varLimit:
		return r.limit, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (r *request) Parent() interpreter.Activation { return nil }

// reset makes r the context of descriptors, each a map of its entries.
func (r *request) reset(descriptors []map[string]string) {
	r.raw, r.descriptors, r.limit = descriptors, nil, nil
}

// limitValue is what CEL sees as limit: its name and id, null when unset.
func limitValue(name, id string) ref.Val {
	m := map[ref.Val]ref.Val{types.String("name"): types.NullValue, types.String("id"): types.NullValue}
	if name != "" {
		m[types.String("name")] = types.String(name)
	}
	if id != "" {
		m[types.String("id")] = types.String(id)
	}
	return types.NewRefValMap(types.DefaultTypeAdapter, m)
}
