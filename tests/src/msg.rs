//! Frontend protocol messages built by hand, for tests that must send what
//! no driver sends: pipelines without a Sync, CopyDone out of place,
//! messages trickled byte by byte or announced larger than they are.

use crate::raw::length_prefixed;

/// A message of type `kind` with `body`.
pub fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&length_prefixed(body));
    out
}

/// Appends `text` and its NUL terminator.
pub fn cstr(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(text.as_bytes());
    out.push(0);
}

pub fn query(sql: &str) -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, sql);
    message(b'Q', &body)
}

/// Parse with no declared parameter types.
pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, name);
    cstr(&mut body, sql);
    body.extend_from_slice(&0i16.to_be_bytes());
    message(b'P', &body)
}

/// Bind of `statement` to the unnamed portal, no parameters, text results.
pub fn bind(statement: &str) -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, "");
    cstr(&mut body, statement);
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    message(b'B', &body)
}

/// Describe of a statement (`S`) or portal (`P`).
pub fn describe(kind: u8, name: &str) -> Vec<u8> {
    let mut body = vec![kind];
    cstr(&mut body, name);
    message(b'D', &body)
}

/// Execute of the unnamed portal, all rows.
pub fn execute() -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, "");
    body.extend_from_slice(&0i32.to_be_bytes());
    message(b'E', &body)
}

pub fn close_statement(name: &str) -> Vec<u8> {
    let mut body = vec![b'S'];
    cstr(&mut body, name);
    message(b'C', &body)
}

pub fn sync() -> Vec<u8> {
    message(b'S', &[])
}

pub fn flush() -> Vec<u8> {
    message(b'H', &[])
}

pub fn copy_data(bytes: &[u8]) -> Vec<u8> {
    message(b'd', bytes)
}

pub fn copy_done() -> Vec<u8> {
    message(b'c', &[])
}

pub fn terminate() -> Vec<u8> {
    message(b'X', &[])
}
