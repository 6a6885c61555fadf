package admit

import (
	"errors"
	"fmt"
)

// Code classifies an error so that the edges of the system (HTTP, gRPC, the
// command line) can choose a status without inspecting messages. The zero
// Code is CodeInternal.
type Code uint8

// The error codes. They say what the caller can do about a failure, not
// where it happened.
const (
	CodeInternal        Code = iota // a bug or an unexpected failure
	CodeInvalid                     // the request or configuration is malformed or out of bounds
	CodeNotFound                    // a lease, reservation or other named thing does not exist
	CodeConflict                    // the thing exists already or changed concurrently
	CodeUnavailable                 // the store could not be reached or timed out
	CodePermission                  // the caller may not do this (unknown tenant, another tenant's API key)
	CodeUnauthenticated             // the caller's credential is missing or unknown
	CodeExhausted                   // a limit leaves the caller nothing more: a lease whose slots another class is owed
)

var codeNames = [...]string{
	CodeInternal:        "internal",
	CodeInvalid:         "invalid",
	CodeNotFound:        "not_found",
	CodeConflict:        "conflict",
	CodeUnavailable:     "unavailable",
	CodePermission:      "permission_denied",
	CodeUnauthenticated: "unauthenticated",
	CodeExhausted:       "exhausted",
}

// String returns the code's stable lower-case name, such as "invalid".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// Error is the error type of Admit's packages. It carries a Code, a message
// meant for the person who made the request, optionally the error that
// caused it, and the field the error is about when there is one.
type Error struct {
	Code    Code
	Message string
	Err     error
	// Field names the parameter or field at fault, such as "burst" for a
	// rule whose burst is out of bounds, so that a configuration loader
	// can point at it without reading the message. Err then says what is
	// wrong with it.
	Field string
}

// Errorf returns an *Error with the given code and a formatted message. A %w
// verb in format wraps its argument as Err.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: err.Error(), Err: errors.Unwrap(err)}
}

// Error returns the message. A nil *Error, returned as an error by
// mistake, says so rather than panic.
func (e *Error) Error() string {
	if e == nil {
		return "<nil *admit.Error>"
	}
	if e.Message == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Message
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// ErrorCode returns the Code of the first *Error in err's chain, CodeInternal
// for any other non-nil error, and CodeInternal for nil as well; callers test
// err != nil first.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) && e != nil {
		return e.Code
	}
	return CodeInternal
}

// ErrorField returns the Field of the first *Error in err's chain that has
// one, or "".
func ErrorField(err error) string {
	switch e := err.(type) {
	case nil:
		return ""
	case *Error:
		if e != nil && e.Field != "" {
			return e.Field
		}
	case interface{ Unwrap() []error }:
		for _, err := range e.Unwrap() {
			if f := ErrorField(err); f != "" {
				return f
			}
		}
		return ""
	}
	return ErrorField(errors.Unwrap(err))
}
