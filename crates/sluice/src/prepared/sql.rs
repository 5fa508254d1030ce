//! Just enough SQL to recognise the statements transaction pooling must
//! treat specially: DEALLOCATE, DISCARD ALL, PREPARE, LISTEN/UNLISTEN, and
//! statements that change session settings. Keywords are matched at the
//! start of each statement, after white space and comments, so that an
//! `UPDATE … SET` is not taken for a `SET`.

/// What a simple query (one statement) means to the pooler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Special {
    /// `DEALLOCATE [PREPARE] ALL`
    DeallocateAll,
    /// `DEALLOCATE [PREPARE] name`
    Deallocate(Vec<u8>),
    /// `DISCARD ALL`
    DiscardAll,
    /// `PREPARE …`
    Prepare,
    /// `LISTEN channel`
    Listen(String),
    /// `UNLISTEN channel`, or `UNLISTEN *` (None)
    Unlisten(Option<String>),
}

/// Splits `text` into statements at semicolons outside quotes, comments
/// and dollar quotes.
fn statements(text: &[u8]) -> Vec<&[u8]> {
    split(text).0
}

/// [`split_as`] with standard_conforming_strings on; a backslash in a
/// plain string casts doubt only if the split with it off differs.
fn split(text: &[u8]) -> (Vec<&[u8]>, bool) {
    let (statements, open, backslash) = split_as(text, false);
    if open || !backslash {
        return (statements, open);
    }
    let (other, other_open, _) = split_as(text, true);
    let same = !other_open && other == statements;
    (statements, !same)
}

/// A byte that continues an identifier in PostgreSQL's scanner (`$`
/// included, and every byte of a multibyte character).
fn continues_identifier(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// The statements of `text`; whether a quote, comment or dollar quote is
/// left open at the end; whether a plain string holds a backslash (with
/// `standard_conforming_strings` off, `off_escapes`, the server reads it
/// as an escape, and a quote after it does not close the string). A text
/// whose split may not be the server's is judged as opaque code: the
/// server is checked afterwards rather than the text believed.
fn split_as(text: &[u8], off_escapes: bool) -> (Vec<&[u8]>, bool, bool) {
    let mut out = Vec::new();
    let mut doubtful = false;
    let mut backslashes = false;
    let mut start = 0;
    let mut i = 0;
    while i < text.len() {
        let after_identifier = i > 0 && continues_identifier(text[i - 1]);
        match text[i] {
            b'\'' => {
                // E'…' (not the end of an identifier like `namE'…'`).
                let escapes = i > 0
                    && matches!(text[i - 1], b'e' | b'E')
                    && !(i > 1 && continues_identifier(text[i - 2]));
                let (end, open, backslash) = skip_string(text, i, escapes || off_escapes);
                doubtful |= open;
                backslashes |= backslash && !escapes;
                i = end;
            }
            b'"' => {
                let end = skip_quoted(text, i, b'"');
                doubtful |= end == text.len() && text.last() != Some(&b'"');
                i = end;
            }
            b'-' if text.get(i + 1) == Some(&b'-') => {
                while i < text.len() && !matches!(text[i], b'\n' | b'\r') {
                    i += 1;
                }
            }
            b'/' if text.get(i + 1) == Some(&b'*') => {
                i = skip_block_comment(text, i);
                doubtful |= i == text.len() && !text.ends_with(b"*/");
            }
            // In an identifier (`price$usd$`) a `$` opens nothing.
            b'$' if after_identifier => i += 1,
            b'$' => {
                let end = skip_dollar_quoted(text, i);
                doubtful |= end == text.len() && !text.ends_with(b"$");
                i = end;
            }
            b';' => {
                out.push(&text[start..i]);
                start = i + 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    out.push(&text[start..]);
    out.retain(|s| !skip_space(s).is_empty());
    (out, doubtful, backslashes)
}

/// A string constant opening at `open`: where it ends, whether it is left
/// open, and whether a backslash is in it. With `escapes` (`E'…'`) a
/// backslash escapes the next byte.
fn skip_string(text: &[u8], open: usize, escapes: bool) -> (usize, bool, bool) {
    let mut backslash = false;
    let mut i = open + 1;
    while i < text.len() {
        match text[i] {
            b'\\' => {
                backslash = true;
                i += if escapes { 2 } else { 1 };
            }
            b'\'' if text.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return (i + 1, false, backslash),
            _ => i += 1,
        }
    }
    (text.len(), true, backslash)
}

fn skip_quoted(text: &[u8], open: usize, quote: u8) -> usize {
    let mut i = open + 1;
    while i < text.len() {
        if text[i] == quote {
            if text.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    i
}

fn skip_block_comment(text: &[u8], open: usize) -> usize {
    let mut depth = 0;
    let mut i = open;
    while i + 1 < text.len() {
        if text[i] == b'/' && text[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if text[i] == b'*' && text[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    text.len()
}

/// `$tag$ … $tag$`; a `$` that does not open a dollar quote (`$1`) is
/// passed over.
fn skip_dollar_quoted(text: &[u8], open: usize) -> usize {
    let mut end = open + 1;
    // (a tag's bytes: letters, digits, `_`, and those of multibyte
    // characters, as PostgreSQL's scanner has them)
    while end < text.len()
        && (text[end].is_ascii_alphanumeric() || text[end] == b'_' || text[end] >= 0x80)
    {
        end += 1;
    }
    if end >= text.len()
        || text[end] != b'$'
        || text[open + 1..end].first().is_some_and(u8::is_ascii_digit)
    {
        return open + 1;
    }
    let tag = &text[open..=end];
    let body = end + 1;
    match text[body..].windows(tag.len()).position(|w| w == tag) {
        Some(p) => body + p + tag.len(),
        None => text.len(),
    }
}

/// White space as PostgreSQL's scanner has it (16 and later count a
/// vertical tab too, which `is_ascii_whitespace` does not).
fn is_space(c: u8) -> bool {
    c.is_ascii_whitespace() || c == 0x0b
}

/// `s` without leading white space and comments.
fn skip_space(mut s: &[u8]) -> &[u8] {
    loop {
        let start = s.iter().position(|&c| !is_space(c)).unwrap_or(s.len());
        let trimmed = &s[start..];
        if trimmed.starts_with(b"--") {
            let nl = trimmed
                .iter()
                .position(|&c| matches!(c, b'\n' | b'\r'))
                .unwrap_or(trimmed.len());
            s = &trimmed[nl..];
        } else if trimmed.starts_with(b"/*") {
            s = &trimmed[skip_block_comment(trimmed, 0)..];
        } else {
            return trimmed;
        }
    }
}

/// The next word (an unquoted identifier's bytes: letters, digits, `_`,
/// `$`, multibyte characters) of `s` and what follows it.
fn word(s: &[u8]) -> (&[u8], &[u8]) {
    let s = skip_space(s);
    let end = s.iter().position(|&c| !is_ident(c)).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// An identifier as PostgreSQL folds it: quoted kept, unquoted lowercased.
fn identifier(s: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let s = skip_space(s);
    if s.first() == Some(&b'"') {
        let end = skip_quoted(s, 0, b'"');
        let inner = &s[1..end.saturating_sub(1).max(1)];
        let name = String::from_utf8_lossy(inner).replace("\"\"", "\"");
        return Some((name.into_bytes(), &s[end..]));
    }
    let (w, rest) = word(s);
    (!w.is_empty()).then(|| (w.to_ascii_lowercase(), rest))
}

fn is_end(s: &[u8]) -> bool {
    skip_space(s).is_empty()
}

/// One quick pass deciding whether the closer, slower looks are needed:
/// true if a statement starts with a keyword of [`starts_special`], the word
/// `temp` appears anywhere, the words `into` (but in a lone INSERT),
/// `create` or `execute` do (EXPLAIN ANALYZE runs what it explains), a
/// function not known harmless is called, `set_config`, `pg_settings` or
/// a session advisory lock function appears, or a Unicode-escaped name or
/// string (`U&"…"`, which may spell any of these). It runs on every simple
/// query, so it finds the few bytes that can start something (`;`, `t`,
/// `T`, `(`, `_`, `&`) sixteen at a time ([`closer_mask`]: SSE2 byte
/// compares on x86-64) and looks closer only at those: about 1
/// instruction a byte for an ordinary query, where a byte-at-a-time table
/// walk cost 10 and a memchr per kind of byte more.
pub fn may_matter(text: &[u8]) -> bool {
    if starts_special(text) {
        return true;
    }
    let mut base = 0;
    while base < text.len() {
        let mut mask = if let Some(block) = text.get(base..base + 16) {
            closer_mask(block)
        } else if let Some(start) = text.len().checked_sub(16) {
            // The tail: the last 16 bytes, less those already looked at.
            closer_mask(&text[start..]) >> (base - start)
        } else {
            closer_mask_bytewise(&text[base..])
        };
        while mask != 0 {
            let at = base + mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if looks_closer(text, at) {
                return true;
            }
        }
        base += 16;
    }
    false
}

/// Whether `may_matter` looks closer at byte `b`. `b | 0x20 == b't'` is
/// exactly `t` or `T`.
fn is_closer(b: u8) -> bool {
    (b == b';') | (b == b'(') | (b == b'_') | (b == b'&') | ((b | 0x20) == b't')
}

/// Bit `i` set when `chunk[i]` (at most 32 bytes) is a byte `may_matter`
/// looks at closer, one byte at a time.
fn closer_mask_bytewise(chunk: &[u8]) -> u32 {
    chunk
        .iter()
        .take(32)
        .enumerate()
        .fold(0, |mask, (i, &b)| mask | (u32::from(is_closer(b)) << i))
}

/// [`closer_mask_bytewise`] of a 16-byte block, with SSE2's byte compares:
/// about 15 instructions for the 16 bytes.
#[cfg(target_arch = "x86_64")]
fn closer_mask(block: &[u8]) -> u32 {
    let Ok(block) = <[u8; 16]>::try_from(block) else {
        return closer_mask_bytewise(block);
    };
    // SAFETY: SSE2 is part of the x86-64 baseline; every x86-64 CPU has it.
    unsafe { closer_mask_sse2(block) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn closer_mask_sse2(block: [u8; 16]) -> u32 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set_epi64x, _mm_set1_epi8,
    };
    let v = u128::from_le_bytes(block);
    // Two halves into one register: the compiler makes it one load.
    let v = _mm_set_epi64x((v >> 64) as u64 as i64, v as u64 as i64);
    let semicolon = _mm_cmpeq_epi8(v, _mm_set1_epi8(b';' as i8));
    let paren = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'(' as i8));
    let underscore = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'_' as i8));
    let ampersand = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'&' as i8));
    let t = _mm_cmpeq_epi8(
        _mm_or_si128(v, _mm_set1_epi8(0x20)),
        _mm_set1_epi8(b't' as i8),
    );
    let hits = _mm_or_si128(
        _mm_or_si128(semicolon, paren),
        _mm_or_si128(_mm_or_si128(underscore, ampersand), t),
    );
    // movemask puts each byte's top bit in bits 0..16 of an i32.
    _mm_movemask_epi8(hits) as u32 & 0xffff
}

#[cfg(not(target_arch = "x86_64"))]
fn closer_mask(block: &[u8]) -> u32 {
    closer_mask_bytewise(block)
}

/// The closer look at a byte `closer_mask` picked out.
fn looks_closer(text: &[u8], at: usize) -> bool {
    match text[at] {
        b';' => starts_special(&text[at + 1..]),
        b'(' => unknown_call_at(text, at) || sequence_call_at(text, at),
        b'_' => session_function_at(text, at),
        // U&"…" or U&'…'
        b'&' => {
            at > 0
                && (text[at - 1] | 0x20) == b'u'
                && matches!(text.get(at + 1), Some(b'"' | b'\''))
        }
        // t or T
        _ => {
            text.get(at..at + 4)
                .is_some_and(|w| w.eq_ignore_ascii_case(b"temp"))
                || words_with_t(text, at)
        }
    }
}

/// Whether the `t` at `at` is in `create`, `execute` or `into` (but a lone
/// INSERT's), told apart by the byte before it.
fn words_with_t(text: &[u8], at: usize) -> bool {
    match at.checked_sub(1).map(|b| text[b] | 0x20) {
        Some(b'a') => word_around(text, at, 4, b"create"),
        Some(b'u') => word_around(text, at, 5, b"execute"),
        Some(b'n') => word_around(text, at, 2, b"into") && !lone_insert(text),
        _ => false,
    }
}

/// Whether the `t` at `at` is byte `offset` of `word`, standing as a word
/// of its own.
fn word_around(text: &[u8], at: usize, offset: usize, word: &[u8]) -> bool {
    let Some(start) = at.checked_sub(offset) else {
        return false;
    };
    let end = start + word.len();
    text.get(start..end)
        .is_some_and(|w| w.eq_ignore_ascii_case(word))
        && (start == 0 || !is_ident(text[start - 1]))
        && text.get(end).is_none_or(|&c| !is_ident(c))
}

/// A text of one INSERT (its INTO makes no table; a `;` may start
/// another statement).
fn lone_insert(text: &[u8]) -> bool {
    word(text).0.eq_ignore_ascii_case(b"insert") && !text.contains(&b';')
}

/// Whether the statement that starts `s` starts with a word that may
/// change what follows the client, or remove a session object that pins
/// it (SET, RESET, DISCARD, DEALLOCATE, PREPARE, LISTEN, UNLISTEN,
/// CREATE, DO, CALL, DECLARE, DROP, CLOSE, EXECUTE): the first word, lowered into a small buffer, is
/// matched by length and bytes (a `match` the compiler makes a jump on
/// the length), not compared with each keyword in turn.
pub fn starts_special(s: &[u8]) -> bool {
    // The first word (as `word` reads it), lowered; none is longer than 10.
    let mut lower = [0u8; 10];
    let mut n = 0;
    for &c in skip_space(s) {
        let l = WORD_LOWER[usize::from(c)];
        if l == 0 {
            break;
        }
        let Some(slot) = lower.get_mut(n) else {
            return false;
        };
        *slot = l;
        n += 1;
    }
    matches!(
        &lower[..n],
        b"set"
            | b"reset"
            | b"discard"
            | b"deallocate"
            | b"prepare"
            | b"listen"
            | b"unlisten"
            | b"create"
            | b"do"
            | b"call"
            | b"declare"
            | b"drop"
            | b"close"
            | b"execute"
    )
}

/// A byte's lower case if it can be part of a word (letters, digits, `_`:
/// what `word` reads), else 0.
static WORD_LOWER: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphanumeric() || b == b'_' {
            t[c] = b.to_ascii_lowercase();
        }
        c += 1;
    }
    t
};

/// Whether the `_` at `at` joins `set_config` or a session advisory lock
/// function (`…advisory_lock`, `…advisory_unlock`).
fn session_function_at(text: &[u8], at: usize) -> bool {
    let before = &text[..at];
    let after = &text[at + 1..];
    let ends = |s: &[u8]| {
        before.len() >= s.len() && before[before.len() - s.len()..].eq_ignore_ascii_case(s)
    };
    let starts = |s: &[u8]| after.len() >= s.len() && after[..s.len()].eq_ignore_ascii_case(s);
    (ends(b"set") && starts(b"config"))
        || (ends(b"advisory") && (starts(b"lock") || starts(b"unlock")))
        // (an UPDATE of pg_settings calls set_config through its rule)
        || (ends(b"pg") && starts(b"settings"))
}

/// Whether the `(` at `at` opens a call of currval or lastval: harmless,
/// but they read what the server's previous client may have left.
fn sequence_call_at(text: &[u8], at: usize) -> bool {
    let Some(end) = skip_space_back(text, at) else {
        return false;
    };
    let (_, word) = word_before(text, end);
    word.eq_ignore_ascii_case(b"currval") || word.eq_ignore_ascii_case(b"lastval")
}

/// Built-in functions that leave nothing in a session: a call of any other
/// function (user-defined, or one that takes locks, sets settings, creates
/// or prepares) makes a text opaque, and the session is checked after its
/// transaction. Sorted, lower case.
const HARMLESS_CALLS: &[&[u8]] = &[
    b"abs",
    b"age",
    b"array_agg",
    b"array_append",
    b"array_cat",
    b"array_dims",
    b"array_fill",
    b"array_length",
    b"array_lower",
    b"array_position",
    b"array_prepend",
    b"array_remove",
    b"array_replace",
    b"array_to_string",
    b"array_upper",
    b"ascii",
    b"avg",
    b"bit_length",
    b"bool_and",
    b"bool_or",
    b"btrim",
    b"cardinality",
    b"cbrt",
    b"ceil",
    b"ceiling",
    b"char_length",
    b"character_length",
    b"chr",
    b"clock_timestamp",
    b"coalesce",
    b"concat",
    b"concat_ws",
    b"count",
    b"current_database",
    b"current_schema",
    b"current_setting",
    b"currval",
    b"date",
    b"date_part",
    b"date_trunc",
    b"decode",
    b"dense_rank",
    b"div",
    b"encode",
    b"every",
    b"exp",
    b"extract",
    b"first_value",
    b"floor",
    b"format",
    b"gcd",
    b"gen_random_uuid",
    b"generate_series",
    b"greatest",
    b"hashtext",
    b"initcap",
    b"int4",
    b"int8",
    b"isfinite",
    b"json_agg",
    b"json_array_elements",
    b"json_array_elements_text",
    b"json_array_length",
    b"json_build_array",
    b"json_build_object",
    b"json_each",
    b"json_each_text",
    b"json_extract_path",
    b"json_extract_path_text",
    b"json_object_agg",
    b"json_object_keys",
    b"json_typeof",
    b"jsonb_agg",
    b"jsonb_array_elements",
    b"jsonb_array_elements_text",
    b"jsonb_array_length",
    b"jsonb_build_array",
    b"jsonb_build_object",
    b"jsonb_each",
    b"jsonb_each_text",
    b"jsonb_extract_path",
    b"jsonb_extract_path_text",
    b"jsonb_insert",
    b"jsonb_object_agg",
    b"jsonb_object_keys",
    b"jsonb_path_query",
    b"jsonb_pretty",
    b"jsonb_set",
    b"jsonb_strip_nulls",
    b"jsonb_typeof",
    b"justify_interval",
    b"lag",
    b"last_value",
    b"lastval",
    b"lcm",
    b"lead",
    b"least",
    b"left",
    b"length",
    b"ln",
    b"log",
    b"lower",
    b"lpad",
    b"ltrim",
    b"make_date",
    b"make_interval",
    b"make_timestamp",
    b"max",
    b"md5",
    b"min",
    b"mod",
    b"nextval",
    b"now",
    b"ntile",
    b"nullif",
    b"num_nonnulls",
    b"num_nulls",
    b"octet_length",
    b"overlay",
    b"percentile_cont",
    b"percentile_disc",
    b"pg_advisory_xact_lock",
    b"pg_advisory_xact_lock_shared",
    b"pg_backend_pid",
    b"pg_column_size",
    b"pg_current_xact_id",
    b"pg_notify",
    b"pg_relation_size",
    b"pg_size_pretty",
    b"pg_sleep",
    b"pg_total_relation_size",
    b"pg_try_advisory_xact_lock",
    b"pg_try_advisory_xact_lock_shared",
    b"pg_typeof",
    b"pi",
    b"plainto_tsquery",
    b"position",
    b"power",
    b"quote_ident",
    b"quote_literal",
    b"quote_nullable",
    b"random",
    b"rank",
    b"regexp_match",
    b"regexp_matches",
    b"regexp_replace",
    b"regexp_split_to_array",
    b"regexp_split_to_table",
    b"repeat",
    b"replace",
    b"reverse",
    b"right",
    b"round",
    b"row_number",
    b"row_to_json",
    b"rpad",
    b"rtrim",
    b"setval",
    b"sign",
    b"split_part",
    b"sqrt",
    b"starts_with",
    b"statement_timestamp",
    b"stddev",
    b"string_agg",
    b"string_to_array",
    b"strpos",
    b"substr",
    b"substring",
    b"sum",
    b"text",
    b"timeofday",
    b"to_char",
    b"to_date",
    b"to_json",
    b"to_jsonb",
    b"to_number",
    b"to_timestamp",
    b"to_tsquery",
    b"to_tsvector",
    b"transaction_timestamp",
    b"translate",
    b"trim",
    b"trunc",
    b"ts_rank",
    b"txid_current",
    b"unnest",
    b"upper",
    b"uuid_generate_v4",
    b"variance",
    b"version",
    b"websearch_to_tsquery",
    b"width_bucket",
];

/// Words after which `(` opens no function call (clauses, operators, types).
const NOT_CALLS: &[&[u8]] = &[
    b"all",
    b"and",
    b"any",
    b"array",
    b"as",
    b"between",
    b"bit",
    b"case",
    b"cast",
    b"char",
    b"character",
    b"decimal",
    b"distinct",
    b"else",
    b"except",
    b"exists",
    b"float",
    b"from",
    b"group",
    b"grouping",
    b"having",
    b"in",
    b"intersect",
    b"interval",
    b"lateral",
    b"limit",
    b"not",
    b"numeric",
    b"offset",
    b"on",
    b"or",
    b"returning",
    b"row",
    b"select",
    b"some",
    b"then",
    b"time",
    b"timestamp",
    b"union",
    b"using",
    b"values",
    b"varchar",
    b"when",
    b"where",
    b"with",
];

/// Keywords PostgreSQL also takes as function names, which open no call
/// only where the grammar puts them: `GROUP BY CUBE (` / `ROLLUP (`,
/// `GROUPING SETS (`, `ON CONFLICT (…) DO`, `FILTER (` / `OVER (` after a
/// call's `)`, `ORDER`/`GROUP`/`PARTITION BY (`, and `JOIN (`, `LIKE (`,
/// `SET (` after an operand (a table, a column, a value). Anywhere else
/// they are calls (reviews hid user functions named `rollup`, `set`,
/// `join`… this way).
fn keyword_in_place(text: &[u8], start: usize, at: usize, word: &[u8]) -> bool {
    let is = |k: &[u8]| word.eq_ignore_ascii_case(k);
    let (before, prev, before_start) = previous_word(text, start);
    let after = |k: &[u8]| before.eq_ignore_ascii_case(k);
    if is(b"cube") || is(b"rollup") {
        after(b"by")
            && previous_word(text, before_start)
                .0
                .eq_ignore_ascii_case(b"group")
    } else if is(b"sets") {
        after(b"grouping")
    } else if is(b"conflict") {
        after(b"on") && next_word_after_group(text, at).eq_ignore_ascii_case(b"do")
    } else if is(b"filter") || is(b"over") {
        prev == Some(b')')
    } else if is(b"by") {
        after(b"order") || after(b"group") || after(b"partition")
    } else if is(b"join") {
        [
            &b"inner"[..],
            b"left",
            b"right",
            b"full",
            b"cross",
            b"natural",
            b"outer",
        ]
        .iter()
        .any(|k| after(k))
            || operand_before(before, prev)
    } else if is(b"like") || is(b"set") {
        operand_before(before, prev) || (is(b"set") && after(b"update"))
    } else {
        false
    }
}

/// The word before `start` (skipping white space), the byte before it,
/// and where that word starts.
fn previous_word(text: &[u8], start: usize) -> (&[u8], Option<u8>, usize) {
    let mut end = start;
    while end > 0 && is_space(text[end - 1]) {
        end -= 1;
    }
    let (word_start, word) = word_before(text, end);
    (word, end.checked_sub(1).map(|i| text[i]), word_start)
}

/// Whether what ends before a keyword is an operand (a name, a value, a
/// closing parenthesis), not a keyword that a call could follow.
fn operand_before(word: &[u8], prev: Option<u8>) -> bool {
    match prev {
        Some(b')' | b'\'' | b'"' | b']') => true,
        Some(c) if is_ident(c) => !word.is_empty() && !in_list(CALL_MAY_FOLLOW, word),
        _ => false,
    }
}

/// Keywords after which an expression (and so a call) may begin. Sorted,
/// lower case.
const CALL_MAY_FOLLOW: &[&[u8]] = &[
    b"all",
    b"and",
    b"any",
    b"as",
    b"between",
    b"by",
    b"case",
    b"distinct",
    b"do",
    b"else",
    b"except",
    b"exists",
    b"from",
    b"having",
    b"ilike",
    b"in",
    b"intersect",
    b"is",
    b"join",
    b"like",
    b"limit",
    b"not",
    b"offset",
    b"on",
    b"or",
    b"returning",
    b"select",
    b"set",
    b"some",
    b"then",
    b"union",
    b"using",
    b"values",
    b"when",
    b"where",
    b"with",
];

/// The word after the parenthesized group that opens at `open` (bounded
/// look: a long group is taken for no match).
fn next_word_after_group(text: &[u8], open: usize) -> &[u8] {
    let mut depth = 0usize;
    for (i, &c) in text.iter().enumerate().skip(open).take(4096) {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return word(&text[i + 1..]).0;
                }
            }
            _ => {}
        }
    }
    &[]
}

/// Words after which the next word names a table, so that `word (` is a
/// column list, not a call.
const TABLE_BEFORE: &[&[u8]] = &[b"into", b"references", b"table"];

/// How far back a quoted name is looked for (PostgreSQL truncates names
/// at 63 bytes; quotes doubled inside may make one longer).
const NAME_SEARCH: usize = 256;

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// Where the text before `end` stops being white space; `None` when a
/// comment ends there (`*/`, or a `--` line before a line break): the caller
/// then takes the `(` for a call (conservative, and no backward search,
/// which repeated `(`s would make quadratic).
fn skip_space_back(text: &[u8], mut end: usize) -> Option<usize> {
    let mut newline = false;
    while end > 0 && is_space(text[end - 1]) {
        newline |= matches!(text[end - 1], b'\n' | b'\r');
        end -= 1;
    }
    if newline || (end >= 2 && &text[end - 2..end] == b"*/") {
        return None;
    }
    Some(end)
}

/// The word that ends at `end` (exclusive) and where it starts.
fn word_before(text: &[u8], end: usize) -> (usize, &[u8]) {
    let mut start = end;
    while start > 0 && is_ident(text[start - 1]) {
        start -= 1;
    }
    (start, &text[start..end])
}

fn in_list(list: &[&[u8]], word: &[u8]) -> bool {
    let mut lower = [0u8; 32];
    if word.len() > lower.len() {
        return false;
    }
    for (l, c) in lower.iter_mut().zip(word) {
        *l = c.to_ascii_lowercase();
    }
    list.binary_search(&&lower[..word.len()]).is_ok()
}

/// Whether `text` calls a function that is not one of `HARMLESS_CALLS`
/// (what a function does is not in the text: such a text is opaque).
/// Quotes are not skipped: a `(` in a literal may make a text opaque for
/// nothing, which costs a check, never a leak.
pub fn calls_unknown_function(text: &[u8]) -> bool {
    memchr::memchr_iter(b'(', text).any(|at| unknown_call_at(text, at))
}

/// Whether the `(` at `at` opens the arguments of a function that is not
/// one of `HARMLESS_CALLS`.
fn unknown_call_at(text: &[u8], at: usize) -> bool {
    let Some(end) = skip_space_back(text, at) else {
        return true;
    };
    if end > 0 && text[end - 1] == b'"' {
        // A quoted name: a call unless it follows INTO or TABLE (looked
        // for only within a name's length, so the search stays short).
        let from = (end - 1).saturating_sub(NAME_SEARCH);
        return match text[from..end - 1].iter().rposition(|&c| c == b'"') {
            Some(open) => !follows_table_keyword(text, from + open),
            None => true,
        };
    }
    let (start, word) = word_before(text, end);
    if word.is_empty() || word[0].is_ascii_digit() || word[0] == b'$' {
        return false;
    }
    if follows_table_keyword(text, start) {
        return false;
    }
    // Schema-qualified (white space may stand around the dot: `public.
    // md5(…)`): only pg_catalog's harmless functions. A comment before the
    // name may hide a dot (`evil./**/lower(`): a call.
    let mut dot = start;
    let mut crossed_line = false;
    while dot > 0 && is_space(text[dot - 1]) {
        crossed_line |= matches!(text[dot - 1], b'\n' | b'\r');
        dot -= 1;
    }
    if (dot >= 2 && &text[dot - 2..dot] == b"*/") || (crossed_line && line_has_comment(text, dot)) {
        return true;
    }
    if dot > 0 && text[dot - 1] == b'.' {
        let mut schema_end = dot - 1;
        while schema_end > 0 && is_space(text[schema_end - 1]) {
            schema_end -= 1;
        }
        let (_, schema) = word_before(text, schema_end);
        return !(schema.eq_ignore_ascii_case(b"pg_catalog") && in_list(HARMLESS_CALLS, word));
    }
    // `AS v(a, b)`, `WITH c(a) AS`: a column list, not a call.
    let (before, _, _) = previous_word(text, start);
    if [&b"as"[..], b"with", b"recursive"]
        .iter()
        .any(|k| before.eq_ignore_ascii_case(k))
    {
        return false;
    }
    if in_list(NOT_CALLS, word) || keyword_in_place(text, start, at, word) {
        return false;
    }
    !in_list(HARMLESS_CALLS, word)
}

/// Whether the word before `start` (skipping white space and one
/// `schema.` qualification) is INTO, REFERENCES or TABLE.
fn follows_table_keyword(text: &[u8], start: usize) -> bool {
    let mut end = start;
    if end > 0 && text[end - 1] == b'.' {
        end = word_before(text, end - 1).0;
    }
    let mut newline = false;
    while end > 0 && is_space(text[end - 1]) {
        newline |= matches!(text[end - 1], b'\n' | b'\r');
        end -= 1;
    }
    let (word_start, word) = word_before(text, end);
    if !in_list(TABLE_BEFORE, word) {
        return false;
    }
    // A keyword at the end of an earlier line may be a comment's last
    // word (`-- copy into`): only if that line has no `--` (a review hid
    // a call this way).
    !newline || !line_has_comment(text, word_start)
}

/// Whether the line that holds byte `at` has a `--` before it.
fn line_has_comment(text: &[u8], at: usize) -> bool {
    let line = text[..at]
        .iter()
        .rposition(|&c| matches!(c, b'\n' | b'\r'))
        .map_or(0, |i| i + 1);
    text[line..at].windows(2).any(|w| w == b"--")
}

/// Whether `s` has the word TEMP or TEMPORARY (not "attempts").
fn temp_keyword(s: &[u8]) -> bool {
    let ident = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    memchr::memchr2_iter(b't', b'T', s).any(|at| {
        if !s
            .get(at..at + 4)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"temp"))
        {
            return false;
        }
        if at > 0 && ident(&s[at - 1]) {
            return false;
        }
        let mut end = at + 4;
        if s.get(end..end + 5)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"orary"))
        {
            end += 5;
        }
        !s.get(end).is_some_and(ident)
    })
}

/// What statements may leave on their server beyond their transaction,
/// judged from their text (any protocol, every statement of a string).
/// What a function or trigger does is not in the text; `opaque` marks
/// text that runs code of its own (DO, CALL), which may do anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effects {
    /// SET, RESET, DISCARD or set_config: session settings may differ.
    pub settings: bool,
    /// SQL-level PREPARE or DEALLOCATE: the server's statements may differ
    /// from what sluice knows.
    pub statements: bool,
    pub listen: bool,
    /// A temporary table may exist.
    pub temp: bool,
    /// A session advisory lock may be held.
    pub locks: bool,
    /// A WITH HOLD cursor may be open.
    pub cursors: bool,
    /// DO, CALL or a call of a function not known to be harmless: code
    /// that may do any of the above, so the server is checked afterwards.
    pub opaque: bool,
    /// DROP, CLOSE, DISCARD or an unlock: a pinning object may be gone.
    pub removes: bool,
    /// currval or lastval: reads the session's sequence state, which the
    /// server's previous client may have left (`tracked::handle_message`).
    pub sequences: bool,
    /// A setting it may change may change what a Parse means (anything
    /// but custom, dotted settings and those read only at run time), or
    /// opaque code: statements parsed after it in its transaction are not
    /// shared (`ParseContext::private_key`).
    pub parsing: bool,
}

impl Effects {
    /// What code sluice cannot read may have done (a FunctionCall; a text
    /// in an encoding whose characters may hold ASCII bytes): anything, so
    /// settings are read back and the server is checked afterwards.
    pub fn unreadable() -> Self {
        Effects {
            opaque: true,
            settings: true,
            parsing: true,
            ..Default::default()
        }
    }

    /// Session objects that may pin a client or need removing.
    pub fn objects(&self) -> bool {
        self.temp || self.locks || self.cursors || self.opaque
    }

    pub fn any(&self) -> bool {
        self.settings || self.statements || self.listen || self.objects()
    }

    pub fn merge(&mut self, other: Effects) {
        self.settings |= other.settings;
        self.statements |= other.statements;
        self.listen |= other.listen;
        self.temp |= other.temp;
        self.locks |= other.locks;
        self.cursors |= other.cursors;
        self.opaque |= other.opaque;
        self.removes |= other.removes;
        self.sequences |= other.sequences;
        self.parsing |= other.parsing;
    }
}

/// The effects of `text` (call only where `may_matter` said yes).
pub fn effects(text: &[u8]) -> Effects {
    let mut e = Effects::default();
    let (statements, doubtful) = split(text);
    // (where the server may split it otherwise, what follows the doubt
    // may be anything: the server is checked afterwards)
    e.opaque = doubtful;
    for s in statements {
        let (first, _) = word(s);
        let is = |k: &[u8]| first.eq_ignore_ascii_case(k);
        if is(b"set") || is(b"reset") {
            e.settings = true;
        } else if is(b"discard") {
            e.settings = true;
            e.removes = true;
            // DISCARD ALL deallocates every statement, sluice's shared
            // ones too: also when it comes in a Parse, which the simple
            // query's path does not see (a review: every client's next
            // Bind on that server failed, 26000).
            let (second, _) = word(word(s).1);
            e.statements |= second.eq_ignore_ascii_case(b"all");
        } else if is(b"prepare") || is(b"deallocate") {
            e.statements = true;
        } else if is(b"listen") || is(b"unlisten") {
            // (an UNLISTEN run from a prepared statement is followed at
            // its Bind, which looks only at statements with an effect)
            e.listen = true;
        } else if is(b"do") || is(b"call") || has_word(s, b"execute") {
            // (SQL EXECUTE runs a prepared statement whose text is not
            // here, also one of sluice's shared ones by its name, and so
            // does EXPLAIN ANALYZE EXECUTE)
            e.opaque = true;
        } else if is(b"declare") {
            e.cursors |= contains_ignore_case(s, b"hold");
        } else if is(b"drop") || is(b"close") {
            e.removes = true;
        }
        // Any CREATE may make a temporary object (`pg_temp.f`, a temporary
        // type or function that would shadow a built-in for the next
        // client), also under EXPLAIN ANALYZE, as may `… INTO TEMP`, a
        // SELECT … INTO (a table in pg_temp when pg_temp comes first in
        // search_path) and anything naming pg_temp.
        if is(b"create")
            || (is(b"explain") && contains_ignore_case(s, b"create"))
            || (temp_keyword(s) && contains_ignore_case(s, b"into"))
            // (SELECT … INTO also under EXPLAIN ANALYZE, or in parentheses)
            || (!is(b"insert") && !is(b"merge") && has_word(s, b"into"))
            || contains_ignore_case(s, b"pg_temp")
        {
            e.temp = true;
        }
    }
    if contains_ignore_case(text, b"set_config") {
        e.settings = true;
    }
    // An UPDATE of pg_settings sets through its rule; a Unicode escape
    // (`U&"pg_\0074emp"`) may spell any name the looks above miss; the
    // `seed` setting (`SET seed`) seeds random() as setseed does, and
    // neither pg_settings nor RESET ALL shows or undoes it.
    if contains_ignore_case(text, b"pg_settings")
        || contains_ignore_case(text, b"seed")
        || contains_ignore_case(text, b"u&\"")
        || contains_ignore_case(text, b"u&'")
    {
        e.opaque = true;
    }
    // (code that may change a setting sluice cannot name; set_config's
    // names are looked at below)
    let hidden = e.opaque
        || memchr::memchr_iter(b'(', text)
            .any(|at| unknown_call_at(text, at) && !is_set_config_call(text, at));
    if calls_unknown_function(text) {
        e.opaque = true;
    }
    if contains_ignore_case(text, b"advisory_lock") {
        e.locks = true;
    }
    if contains_ignore_case(text, b"currval") || contains_ignore_case(text, b"lastval") {
        e.sequences = true;
    }
    if contains_ignore_case(text, b"advisory_unlock") {
        e.removes = true;
    }
    if contains_ignore_case(text, b"deallocate") {
        e.statements = true;
    }
    if e.opaque {
        // Read the settings back; statements, LISTENs and objects are
        // checked on the server (see `tracked::after_transaction`).
        e.settings = true;
    }
    e.parsing = hidden || (e.settings && changes_parsing(text));
    e
}

/// Whether the `(` at `at` opens a call of pg_catalog's set_config, named
/// so: an unqualified name may be a function of the client's that comes
/// first in its search_path (a review), whose setting's name
/// `changes_parsing` reads.
fn is_set_config_call(text: &[u8], at: usize) -> bool {
    let Some(end) = skip_space_back(text, at) else {
        return false;
    };
    let (start, word) = word_before(text, end);
    if !word.eq_ignore_ascii_case(b"set_config") {
        return false;
    }
    // (a comment may hide a qualifying schema: not looked into)
    if memchr::memmem::find(text, b"--").is_some() || memchr::memmem::find(text, b"/*").is_some() {
        return false;
    }
    let before = text[..start].trim_ascii_end();
    before.strip_suffix(b".").is_some_and(|schema| {
        let schema = schema.trim_ascii_end();
        word_before(schema, schema.len())
            .1
            .eq_ignore_ascii_case(b"pg_catalog")
    })
}

/// Settings PostgreSQL reads only when a statement runs, never while it
/// parses one: changing them leaves statements shared (PostgREST's
/// per-request `set_config('request.…', …, true)` and a `SET LOCAL
/// statement_timeout` are the common cases; custom, dotted names too).
const RUN_TIME_ONLY: &[&str] = &[
    "application_name",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "work_mem",
    "maintenance_work_mem",
    "temp_buffers",
    "synchronous_commit",
    "jit",
    "plan_cache_mode",
    "random_page_cost",
    "seq_page_cost",
    "effective_cache_size",
    "transaction",
    "characteristics",
    "transaction_isolation",
    "transaction_read_only",
    "transaction_deferrable",
    "default_transaction_isolation",
    "default_transaction_read_only",
    "default_transaction_deferrable",
];

fn run_time_only(name: &str) -> bool {
    name.contains('.')
        || name.starts_with("enable_")
        || name.starts_with("log_")
        || RUN_TIME_ONLY.contains(&name)
}

/// Whether a setting `text` may change (SET, RESET, set_config, DISCARD)
/// may change what a Parse means: yes unless every one is named, and
/// named among [`run_time_only`].
fn changes_parsing(text: &[u8]) -> bool {
    // A backslash reads as an escape or not as standard_conforming_strings
    // says, which the client may have turned off: a literal's end is then
    // not where these looks see it (a review hid transform_null_equals
    // in a set_config name that read as a custom one).
    if memchr::memchr(b'\\', text).is_some() {
        return true;
    }
    for s in statements(text) {
        let (first, rest) = word(s);
        if first.eq_ignore_ascii_case(b"set") || first.eq_ignore_ascii_case(b"reset") {
            if !set_variable(rest).is_some_and(|n| run_time_only(&n)) {
                return true;
            }
        } else if first.eq_ignore_ascii_case(b"discard") {
            return true;
        }
    }
    set_config_names(text)
        .iter()
        .any(|n| !n.as_deref().is_some_and(run_time_only))
}

/// The variable a SET or RESET names (what follows the keyword), lower
/// case, parts joined by dots, with white space or comments around them as
/// PostgreSQL's grammar allows (`app . tenant` was read as `app` and never
/// reset; a review); each part cut to 63 bytes, as PostgreSQL cuts
/// identifiers; a quoted part may hold the dot itself (`"app.tenant"`).
fn set_variable(mut rest: &[u8]) -> Option<String> {
    let (next, after) = word(rest);
    if next.eq_ignore_ascii_case(b"session") || next.eq_ignore_ascii_case(b"local") {
        rest = after;
    }
    let mut parts = Vec::new();
    while let Some((part, after)) = identifier(rest) {
        let part = String::from_utf8_lossy(&part).into_owned();
        parts.push(cut_identifier(part));
        match skip_space(after).strip_prefix(b".") {
            Some(next) => rest = next,
            None => break,
        }
    }
    (!parts.is_empty()).then(|| parts.join(".").to_ascii_lowercase())
}

/// The first argument of each set_config(…) in `text`, lower case, when
/// it is a plain string literal (None otherwise: any name).
fn set_config_names(text: &[u8]) -> Vec<Option<String>> {
    let mut names = Vec::new();
    let lower = text.to_ascii_lowercase();
    let mut from = 0;
    while let Some(at) = lower[from..].windows(10).position(|w| w == b"set_config") {
        let after = &text[from + at + 10..];
        from += at + 10;
        let after = skip_space(after);
        let Some(after) = after.strip_prefix(b"(") else {
            continue;
        };
        let after = skip_space(after);
        // (only a plain literal that is the whole first argument: a
        // doubled quote, a cast or an operator after it may make any name;
        // a review: `'{"x.": "transform_null_equals"}'::json->>'x.'`)
        let name = after.strip_prefix(b"'").and_then(|after| {
            let end = after.iter().position(|&c| c == b'\'')?;
            skip_space(&after[end + 1..])
                .starts_with(b",")
                .then(|| String::from_utf8_lossy(&after[..end]).to_ascii_lowercase())
        });
        names.push(name);
    }
    names
}

/// Whether `text` is a lone BEGIN or START TRANSACTION (with its modes).
/// (Its first two letters decide most texts: it runs once a transaction.)
pub fn starts_transaction(text: &[u8]) -> bool {
    let lead = |s: &[u8]| s.get(..2).map(|w| [w[0] | 0x20, w[1] | 0x20]);
    let start = match text.first() {
        Some(c) if c.is_ascii_alphabetic() => lead(text),
        _ => lead(skip_space(text)),
    };
    if !matches!(start, Some([b'b', b'e'] | [b's', b't'])) {
        return false;
    }
    let first = word(text).0;
    (first.eq_ignore_ascii_case(b"begin") || first.eq_ignore_ascii_case(b"start"))
        && statements(text).len() == 1
}

/// The command tag PostgreSQL answers a transaction start with.
pub fn transaction_start_tag(text: &[u8]) -> &'static str {
    if word(text).0.eq_ignore_ascii_case(b"start") {
        "START TRANSACTION"
    } else {
        "BEGIN"
    }
}

/// Whether `text` starts with a statement PostgreSQL runs in a failed
/// transaction block (it ends the block): ROLLBACK, COMMIT, END, ABORT,
/// PREPARE TRANSACTION.
pub fn ends_transaction(text: &[u8]) -> bool {
    let first = word(text).0;
    [&b"rollback"[..], b"commit", b"end", b"abort", b"prepare"]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k))
}

/// Recognises a simple query that is exactly one special statement.
pub fn special(text: &[u8]) -> Option<Special> {
    let parts = statements(text);
    let [one] = parts.as_slice() else {
        return None;
    };
    special_statement(one)
}

/// The special statements among all statements of `text`, in order.
pub fn specials(text: &[u8]) -> Vec<Special> {
    statements(text)
        .into_iter()
        .filter_map(special_statement)
        .collect()
}

fn special_statement(one: &[u8]) -> Option<Special> {
    let (first, rest) = word(one);
    if first.eq_ignore_ascii_case(b"deallocate") {
        let (next, after_next) = word(rest);
        let after = if next.eq_ignore_ascii_case(b"prepare") {
            after_next
        } else {
            rest
        };
        let quoted = skip_space(after).starts_with(b"\"");
        let (name, tail) = identifier(after)?;
        if !is_end(tail) {
            return None;
        }
        if !quoted && name == b"all" {
            return Some(Special::DeallocateAll);
        }
        return Some(Special::Deallocate(name));
    }
    if first.eq_ignore_ascii_case(b"discard") {
        let (what, tail) = word(rest);
        return (what.eq_ignore_ascii_case(b"all") && is_end(tail)).then_some(Special::DiscardAll);
    }
    if first.eq_ignore_ascii_case(b"prepare") {
        return Some(Special::Prepare);
    }
    if first.eq_ignore_ascii_case(b"listen") {
        let (name, tail) = identifier(rest)?;
        return is_end(tail)
            .then(|| channel(&name))
            .flatten()
            .map(Special::Listen);
    }
    if first.eq_ignore_ascii_case(b"unlisten") {
        let after = skip_space(rest);
        if let Some(tail) = after.strip_prefix(b"*") {
            return is_end(tail).then_some(Special::Unlisten(None));
        }
        let (name, tail) = identifier(rest)?;
        return is_end(tail)
            .then(|| channel(&name))
            .flatten()
            .map(|c| Special::Unlisten(Some(c)));
    }
    None
}

/// Whether a LISTEN or UNLISTEN among `text`'s statements names its
/// channel in a way sluice cannot read as PostgreSQL will (the pool's hub
/// would listen to another name, and the client hear nothing): a
/// Unicode-escaped name (`U&"…"`), bytes that are no UTF-8, or, when the
/// client's encoding is not UTF-8 (`utf8` false), any byte past ASCII
/// (PostgreSQL converts the name first; sluice reads bytes).
pub fn unfollowable_listen(text: &[u8], utf8: bool) -> bool {
    statements(text).into_iter().any(|one| {
        let (first, rest) = word(one);
        if !first.eq_ignore_ascii_case(b"listen") && !first.eq_ignore_ascii_case(b"unlisten") {
            return false;
        }
        let name = skip_space(rest);
        if matches!(name, [b'u' | b'U', b'&', b'"', ..]) {
            return true;
        }
        // The name only (a comment after it may hold anything).
        let end = if name.first() == Some(&b'"') {
            skip_quoted(name, 0, b'"')
        } else {
            word(name).0.len()
        };
        let name = &name[..end.min(name.len())];
        (!utf8 && !name.is_ascii()) || std::str::from_utf8(name).is_err()
    })
}

/// A channel name as PostgreSQL keeps it: an identifier cut to 63 bytes
/// (NAMEDATALEN - 1) on a character boundary, as notifications then name
/// it. None for an empty name, which PostgreSQL refuses (42601).
fn channel(name: &[u8]) -> Option<String> {
    let name = String::from_utf8_lossy(name);
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    (end > 0).then(|| name[..end].to_owned())
}

/// Names of custom (dotted) settings that `text` may set for the session:
/// the variable of a SET (not SET LOCAL, which ends with its
/// transaction), and the first argument of set_config('…', …). Custom
/// placeholders are missing from pg_settings, so sluice reads them back by
/// name. (A RESET needs no name: what the client held is read back
/// anyway, and a name it did not hold is gone; review 36: a transaction
/// of 1,001 SET LOCALs or RESETs was counted past `MAX_CUSTOM_NAMES`.)
pub fn custom_names(text: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = statements(text)
        .into_iter()
        .filter_map(|s| {
            let (first, rest) = word(s);
            let local = word(rest).0.eq_ignore_ascii_case(b"local");
            (first.eq_ignore_ascii_case(b"set") && !local)
                .then(|| set_variable(rest))
                .flatten()
        })
        .collect();
    names.extend(set_config_names(text).into_iter().flatten());
    names.retain(|n| n.contains('.'));
    names
}

/// An identifier cut to NAMEDATALEN - 1 (63) bytes on a character
/// boundary, as PostgreSQL's scanner cuts it.
fn cut_identifier(mut name: String) -> String {
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// Whether `word` is in `s` as a word of its own (not inside another).
fn has_word(s: &[u8], word: &[u8]) -> bool {
    s.windows(word.len()).enumerate().any(|(at, w)| {
        w.eq_ignore_ascii_case(word)
            && (at == 0 || !is_ident(s[at - 1]))
            && s.get(at + word.len()).is_none_or(|&c| !is_ident(c))
    })
}

fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which texts make statements parsed after them private: settings
    /// read while parsing, and code that may set anything; not custom or
    /// run-time-only settings (PostgREST's per-request set_config).
    #[test]
    fn settings_that_change_parsing() {
        let parsing = |text: &str| {
            let e = if may_matter(text.as_bytes()) {
                effects(text.as_bytes())
            } else {
                Effects::default()
            };
            e.parsing
        };
        for text in [
            "set transform_null_equals = on",
            "SET LOCAL search_path = a, b",
            "set time zone 'UTC'",
            "reset all",
            "set role app",
            "discard all",
            "select set_config('search_path', 'x', true)",
            "select set_config(name, '1', true) from t",
            "select set_config('a''b.c', '1', true)",
            "select set_config('request.x', '1', true)",
            "select pg_catalog.set_config('{\"x.\": \"transform_null_equals\"}'::json->>'x.', 'on', true)",
            "select evil.set_config('request.x', '1', true)",
            "select evil./**/set_config('request.x', '1', true)",
            r#"select pg_catalog.set_config('{"x.\\\"\',":"transform_null_equals"}'::json->>'x.\"\',', 'on', true)"#,
            "select my_func()",
            "do $$ begin end $$",
        ] {
            assert!(parsing(text), "{text}");
        }
        for text in [
            "set local statement_timeout = '5s'",
            "SET application_name = 'x'",
            "set transaction isolation level serializable",
            "set session characteristics as transaction read only",
            "set app.tenant = 7",
            "select pg_catalog.set_config('request.x', '1', true), now()",
            "select 1",
        ] {
            assert!(!parsing(text), "{text}");
        }
        assert!(effects(b"discard all").statements);
        assert!(!effects(b"discard temp").statements);
    }

    #[test]
    fn a_lone_begin_is_seen() {
        for text in [
            &b"begin"[..],
            b" BEGIN ISOLATION LEVEL SERIALIZABLE",
            b"start transaction read only;",
            b"/* tx */ Begin",
        ] {
            assert!(
                starts_transaction(text),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        for text in [&b"select 1"[..], b"begin; select 1", b"state", b"b", b""] {
            assert!(
                !starts_transaction(text),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        assert_eq!(
            transaction_start_tag(b"/* x */ START TRANSACTION READ ONLY"),
            "START TRANSACTION"
        );
        assert_eq!(
            transaction_start_tag(b"-- x\nbegin work read only"),
            "BEGIN"
        );
    }

    #[test]
    fn sequence_reads_are_seen_and_harmless() {
        for text in [
            &b"select currval('s')"[..],
            b"SELECT LASTVAL ()",
            b"insert into t values (1); select pg_catalog.currval('t_id_seq')",
        ] {
            assert!(may_matter(text), "{}", String::from_utf8_lossy(text));
            let e = effects(text);
            assert!(e.sequences && !e.opaque, "{e:?}");
        }
        assert!(!effects(b"select nextval('s')").sequences);
    }

    #[test]
    fn recognises_special_statements() {
        assert_eq!(special(b"DEALLOCATE ALL"), Some(Special::DeallocateAll));
        assert_eq!(
            special(b" deallocate prepare all ;"),
            Some(Special::DeallocateAll)
        );
        assert_eq!(
            special(b"DEALLOCATE S_1"),
            Some(Special::Deallocate(b"s_1".to_vec()))
        );
        assert_eq!(
            special(b"deallocate prepare \"S_1\""),
            Some(Special::Deallocate(b"S_1".to_vec()))
        );
        assert_eq!(special(b"/* x */ discard all"), Some(Special::DiscardAll));
        assert_eq!(special(b"DISCARD PLANS"), None);
        assert_eq!(special(b"prepare q as select 1"), Some(Special::Prepare));
        assert_eq!(
            special(b"LISTEN Chan"),
            Some(Special::Listen("chan".into()))
        );
        assert_eq!(
            special(b"listen \"Chan\";"),
            Some(Special::Listen("Chan".into()))
        );
        assert_eq!(special(b"UNLISTEN *"), Some(Special::Unlisten(None)));
        assert_eq!(
            special(b"unlisten c"),
            Some(Special::Unlisten(Some("c".into())))
        );
        assert_eq!(special(b"listen a; listen b"), None);
        assert_eq!(
            specials(b"select 1; UNLISTEN *; RESET ALL"),
            [Special::Unlisten(None)]
        );
        assert_eq!(special(b"select 'listen x'"), None);
    }

    /// `may_matter` as it was written first (a memchr per kind of byte),
    /// kept to check the one-pass version against.
    fn may_matter_reference(text: &[u8]) -> bool {
        let mut start = 0;
        loop {
            if starts_special(&text[start..]) {
                return true;
            }
            match memchr::memchr(b';', &text[start..]) {
                Some(p) => start += p + 1,
                None => break,
            }
        }
        let temp = memchr::memchr2_iter(b't', b'T', text).any(|at| {
            text.get(at..at + 4)
                .is_some_and(|w| w.eq_ignore_ascii_case(b"temp"))
                || word_around(text, at, 4, b"create")
                || word_around(text, at, 5, b"execute")
                || (word_around(text, at, 2, b"into") && !lone_insert(text))
        });
        let unicode = memchr::memchr_iter(b'&', text).any(|at| {
            at > 0
                && (text[at - 1] | 0x20) == b'u'
                && matches!(text.get(at + 1), Some(b'"' | b'\''))
        });
        temp || unicode
            || calls_unknown_function(text)
            || memchr::memchr_iter(b'_', text).any(|at| session_function_at(text, at))
    }

    /// The keywords `starts_special` knows, for the tests.
    const STATEMENT_STARTS: &[&[u8]] = &[
        b"set",
        b"reset",
        b"discard",
        b"deallocate",
        b"prepare",
        b"listen",
        b"unlisten",
        b"create",
        b"do",
        b"call",
        b"declare",
        b"drop",
        b"close",
        b"execute",
    ];

    #[test]
    fn statement_starts_are_the_keywords_in_any_case_and_nothing_else() {
        for k in STATEMENT_STARTS {
            let k = std::str::from_utf8(k).unwrap();
            assert!(starts_special(k.as_bytes()), "{k}");
            assert!(starts_special(
                format!("  /* c */ {} x", k.to_uppercase()).as_bytes()
            ));
            assert!(!starts_special(format!("{k}x").as_bytes()), "{k}x");
            assert!(
                !starts_special(&k.as_bytes()[1..]),
                "{k} less its first letter"
            );
        }
        for other in [
            "select",
            "update t set x = 1",
            "",
            ";",
            "s",
            "sets",
            "deallocated",
        ] {
            assert!(!starts_special(other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn closer_mask_marks_exactly_the_closer_bytes() {
        for b in 0..=255u8 {
            let want = matches!(b, b';' | b'(' | b'_' | b'&' | b't' | b'T');
            for at in [0usize, 7, 15] {
                let mut chunk = [b'x'; 16];
                chunk[at] = b;
                let got = closer_mask(&chunk);
                let expect = if want { 1u32 << at } else { 0 };
                assert_eq!(got, expect, "byte {b:#x} at {at}");
            }
        }
        for b in 0..=255u8 {
            let chunk = [b; 5];
            let want = if is_closer(b) { 0b11111 } else { 0 };
            assert_eq!(closer_mask_bytewise(&chunk), want, "byte {b:#x}");
        }
        // A short tail: only its own bytes count.
        assert_eq!(closer_mask_bytewise(b"a;"), 0b10);
        assert_eq!(closer_mask_bytewise(b""), 0);
    }

    #[test]
    fn one_pass_agrees_with_the_reference() {
        const PIECES: &[&str] = &[
            "select ",
            "SET ",
            "set",
            "_config",
            "(",
            ")",
            ";",
            " ",
            "t",
            "Temp",
            "emp",
            "advisory",
            "_lock",
            "_unlock",
            "pg_",
            "abs",
            "now()",
            "x",
            "\"",
            "'",
            "--",
            "\n",
            "/*",
            "*/",
            "$1",
            "$$",
            "into ",
            "table ",
            "pg_catalog.",
            "listen ",
            "create",
            "1",
            ",",
            "unlisten",
            "f(",
            "do ",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut both = [0u32; 2];
        for _ in 0..50_000 {
            let n = (next() % 24) as usize;
            let text: String = (0..n)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            assert_eq!(
                may_matter(text.as_bytes()),
                may_matter_reference(text.as_bytes()),
                "{text:?}"
            );
            both[usize::from(may_matter(text.as_bytes()))] += 1;
        }
        assert!(both.iter().all(|&n| n > 5_000), "{both:?}");
    }

    #[test]
    fn quick_look_skips_ordinary_queries() {
        assert!(!may_matter(
            b"SELECT abalance FROM pgbench_accounts WHERE aid = $1"
        ));
        assert!(may_matter(
            b"select pg_catalog.set_config('a.b', '1', false)"
        ));
        assert!(may_matter(b"Listen x"));
        assert!(!may_matter(b"UPDATE t SET x = 1 OFFSET 2"));
        assert!(may_matter(b"select 1; SET search_path = a"));
        assert!(may_matter(b"select PG_TRY_ADVISORY_LOCK(1)"));
        assert!(!may_matter(b"select pg_advisory_xact_lock(1)"));
        assert!(may_matter(b"create temp table t (x int)"));
        assert!(!may_matter(
            b"select created_at, intone, executed from t order by created_at"
        ));
        assert!(!may_matter(b"insert into t (a) values (1)"));
    }

    /// What runs code or makes objects the words at a statement's start
    /// do not show (found by a review: each leaked to the next client).
    #[test]
    fn hidden_effects_are_seen() {
        let opaque = [
            &b"update pg_settings set setting = 's2' where name = 'search_path'"[..],
            b"EXECUTE sluice_3",
            b"explain analyze execute s(1)",
            b"select 'x' as v into U&\"pg_\\0074emp\".leak",
            b"select U&'\\0041'",
        ];
        let seen = |texts: &[&[u8]], kind: fn(&Effects) -> bool| {
            for text in texts {
                let shown = String::from_utf8_lossy(text);
                assert!(may_matter(text), "{shown}");
                assert!(kind(&effects(text)), "{shown}");
            }
        };
        seen(&opaque, |e| e.opaque);
        assert!(may_matter(b"SET\x0bapp.tenant = 1"));
        assert!(effects(b"SET seed = 0.42").opaque);
        let temp = [
            &b"select 'x' as v into leak2"[..],
            b"explain analyze create table leak3 as select 1",
            b"insert into t values (1); select 2 into x",
            b"EXPLAIN ANALYZE SELECT 666 AS a INTO foo",
            b"(SELECT 777 AS a INTO foo)",
        ];
        seen(&temp, |e| e.temp);
    }

    #[test]
    fn finds_session_changes_at_statement_starts_only() {
        let settings = |t: &[u8]| effects(t).settings;
        assert!(settings(b"SET search_path TO x"));
        assert!(settings(b"begin; set local x = 1; commit"));
        assert!(settings(b"select set_config('a.b', '1', false)"));
        assert!(settings(b"-- c\nRESET ALL"));
        assert!(!settings(b"UPDATE t SET x = 1"));
        assert!(!settings(b"select 'a; set x' from t offset 1"));
        assert!(!settings(b"select $$;set$$"));
        assert!(effects(b"begin; PREPARE p AS select 1").statements);
    }

    #[test]
    fn calls_of_unknown_functions_are_opaque() {
        for harmless in [
            &b"SELECT abalance FROM pgbench_accounts WHERE aid = $1"[..],
            b"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($3, $2, $1, $4, CURRENT_TIMESTAMP)",
            b"select count(*), max(x), COALESCE(a, b) from t where x in (1, 2)",
            b"select pg_catalog.now(), x::numeric(10, 2) from t",
            b"insert into s.t (a) values (1)",
            b"create table t (x int)",
            b"select exists (select 1) and not (true)",
        ] {
            assert!(
                !calls_unknown_function(harmless),
                "{}",
                String::from_utf8_lossy(harmless)
            );
        }
        for opaque in [
            &b"select take_lock()"[..],
            b"SELECT * FROM my_func(1)",
            b"select public.lower(1)",
            b"select \"Weird\"(1)",
            b"select pg_advisory_lock(1)",
            b"select x from t where f (x)",
            b"select lk/**/(42)",
            b"select lk -- values\n(42)",
            b"select lk\n(42)",
            b"select public.within(44)",
            b"select f$1(1)",
        ] {
            assert!(
                calls_unknown_function(opaque),
                "{}",
                String::from_utf8_lossy(opaque)
            );
            assert!(may_matter(opaque) && effects(opaque).opaque);
        }
    }

    #[test]
    fn long_texts_cost_time_in_proportion() {
        // Repeated patterns that a backward search would make quadratic.
        for unit in [&b"*/("[..], b"\n(", b"\"(", b"x(", b"a.b(", b"--\n("] {
            let text = unit.repeat(2_000_000 / unit.len());
            let started = std::time::Instant::now();
            let _ = may_matter(&text) && effects(&text).any();
            assert!(
                started.elapsed() < std::time::Duration::from_secs(2),
                "{:?}: {:?}",
                String::from_utf8_lossy(unit),
                started.elapsed()
            );
        }
    }

    #[test]
    fn recognises_statements_that_end_a_failed_block() {
        for text in [
            &b"ROLLBACK"[..],
            b" commit",
            b"end",
            b"ABORT",
            b"rollback to savepoint a",
        ] {
            assert!(ends_transaction(text));
        }
        assert!(!ends_transaction(b"select 1"));
    }

    #[test]
    fn harmless_lists_are_sorted() {
        for list in [HARMLESS_CALLS, NOT_CALLS, TABLE_BEFORE, CALL_MAY_FOLLOW] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
    }

    #[test]
    fn calls_hidden_by_keywords_comments_or_spacing_are_calls() {
        // Found by a review, each hiding a user function's call.
        for text in [
            "select 1 -- load into\nset_tenant('a')",
            "select 1 -- the table\n, take_lock(1)",
            "select within(1)",
            "select rollup(1)",
            "select cube(1, 2)",
            "select over(1)",
            "select public. md5(42)",
            "select public . lower(42)",
            // From the review of the fixes.
            "select 1, rollup('a')",
            "select 1 order by rollup('k')",
            "select 1 from (select 1) x join (select 1) y on conflict('c')",
            "select set('d')",
            "select by('e')",
            "select is('f')",
            "select like('g')",
            "select join('h')",
            "select evil./**/lower('i')",
            "select evil.--x\nlower('j')",
        ] {
            assert!(calls_unknown_function(text.as_bytes()), "{text}");
        }
        // The grammar's own places still open no call.
        for text in [
            "select a, count(*) filter (where b) over (partition by c) from t group by rollup (a, b)",
            "select a from t group by grouping sets ((a), ())",
            "insert into t (a) values (1) on conflict (a) do nothing",
            "insert into\n t (a) values (1)",
            "select percentile_cont(0.5) within group (order by a) from t",
            "select a from t order by (a) limit 1",
            "select * from a join (select 1) b on true",
            "select * from a left join (select 1) b on true",
            "update t set (a, b) = (1, 2)",
            "insert into t (a) values (1) on conflict (a) do update set (a) = (excluded.a)",
            "select a from t where a like ('x%')",
            "select sum(a) over (order by b) from t",
            // Column lists and common built-ins (the review's costs).
            "select * from (values (1, 'a')) as v(id, name)",
            "with c(a) as (select 1) select * from c",
            "select string_to_array('a,b', ',')",
        ] {
            assert!(!calls_unknown_function(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn listens_sluice_cannot_follow() {
        assert!(unfollowable_listen(br#"LISTEN U&"\0041bc""#, true));
        assert!(unfollowable_listen(
            br#"select 1; unlisten u&"d\0061ta""#,
            true
        ));
        assert!(unfollowable_listen(b"listen ch\xe4n", true), "no UTF-8");
        assert!(
            unfollowable_listen("listen chän".as_bytes(), false),
            "LATIN1 client"
        );
        assert!(!unfollowable_listen("listen chän".as_bytes(), true));
        assert!(!unfollowable_listen(b"listen chan; unlisten *", false));
        assert!(!unfollowable_listen(br#"listen "U&x""#, true));
        assert!(!unfollowable_listen(b"listen u", true));
        assert!(!unfollowable_listen(br#"select 'listen U&"x"'"#, true));
        assert!(
            !unfollowable_listen("listen chan -- café".as_bytes(), false),
            "a comment is no name (review 28)"
        );
        assert!(unfollowable_listen(
            "listen \"chän\" -- x".as_bytes(),
            false
        ));
    }

    #[test]
    fn channels_are_named_as_postgresql_keeps_them() {
        assert_eq!(special(br#"LISTEN """#), None, "refused by PostgreSQL");
        // Unquoted names with `$` or letters beyond ASCII (a review).
        assert_eq!(
            special("listen chän".as_bytes()),
            Some(Special::Listen("chän".into()))
        );
        assert_eq!(special(b"listen a$b"), Some(Special::Listen("a$b".into())));
        let long = "c".repeat(70);
        assert_eq!(
            special(format!("listen {long}").as_bytes()),
            Some(Special::Listen("c".repeat(63)))
        );
        // Cut on a character boundary: 62 bytes, not half an é.
        let accented = format!("\"{}é\"", "c".repeat(62));
        assert_eq!(
            special(format!("unlisten {accented}").as_bytes()),
            Some(Special::Unlisten(Some("c".repeat(62))))
        );
    }

    #[test]
    fn a_line_comment_ends_at_a_carriage_return_too() {
        // PostgreSQL's scanner ends `--` at \r as at \n (a review hid
        // SET, PREPARE, cursors and calls behind it).
        let e = effects(b"SELECT 1 --\r;SET app.tenant = 'x'; PREPARE p AS SELECT 1");
        assert!(e.settings && e.statements, "{e:?}");
        assert!(calls_unknown_function(
            b"SELECT 1, -- copy into\r set_tenant('a')"
        ));
        assert_eq!(statements(b"select 1 --c\r; select 2").len(), 2);
    }

    #[test]
    fn a_string_or_dollar_sign_hides_no_statement() {
        // Found by a review: each text hid the SET, PREPARE, cursor and
        // temporary table after it in one "string".
        let tail = "; set search_path = pg_catalog; prepare p as select 1; \
                    declare c cursor with hold for select 1; create temp table t as select 1";
        for head in [
            r"select E'it\'s'",
            r"select e'\\'",
            "select 1 as price$usd$",
            "select $é$x$é$",
        ] {
            let text = format!("{head}{tail}");
            let e = effects(text.as_bytes());
            assert!(
                e.settings && e.statements && e.cursors && e.temp && !e.opaque,
                "{text}: {e:?}"
            );
            assert_eq!(statements(text.as_bytes()).len(), 5, "{text}");
        }
        // A backslash in a plain string is an escape when the client has
        // standard_conforming_strings off: which statements follow is not
        // known from the text, so the server is checked afterwards.
        for text in [
            r"select '\''; set statement_timeout = 1; select ''",
            "select 'unterminated; set role r",
            "select 1 /* open; set role r",
            "select $q$ open; set role r",
        ] {
            assert!(effects(text.as_bytes()).opaque, "{text}");
        }
        assert!(!effects(b"select 'it''s'; set role r").opaque);
        // A backslash that changes nothing either way casts no doubt.
        assert!(
            !effects(br"insert into readings (temperature, note) values (21, 'C:\data')").opaque
        );
        assert!(!effects(b"select name$1 from t; set role r").opaque);
    }

    #[test]
    fn finds_what_outlives_a_transaction() {
        assert!(effects(b"DECLARE c CURSOR WITH HOLD FOR select 1").cursors);
        assert!(!effects(b"DECLARE c CURSOR FOR select 1").cursors);
        assert!(effects(b"select 1 as x into temp t").temp);
        // Found by a review: a temporary table made where the text did not
        // say so.
        assert!(effects(b"explain analyze create temp table t as select 1").temp);
        assert!(effects(b"select 1 as x into t").temp);
        assert!(!effects(b"select 1 as intox from t").temp);
        assert!(effects(b"create temporary table t (x int)").temp);
        assert!(effects(b"create table pg_temp.t (x int)").temp);
        assert!(effects(b"create function f() returns int language sql as 'select 1'").temp);
        assert!(!effects(b"insert into attempts values (1)").temp);
        assert!(effects(b"select pg_try_advisory_lock(1)").locks);
        assert!(!effects(b"select pg_advisory_xact_lock(1)").locks);
        assert!(effects(b"select pg_advisory_unlock(1)").removes);
        assert!(effects(b"drop table t").removes);
        // Any DEALLOCATE, even in a string run by a function.
        assert!(effects(b"select f('DEALLOCATE sluice_1')").statements);
        let opaque = effects(b"DO $$BEGIN SET ROLE r; END$$");
        assert!(opaque.opaque && opaque.settings && opaque.objects());
        assert!(effects(b"call p()").opaque);
        for text in [
            &b"do $$ begin end $$"[..],
            b"CALL p()",
            b"declare c cursor with hold for select 1",
            b"select 1 into temp t",
            b"drop table t",
            b"close c",
            b"select pg_advisory_unlock_all()",
        ] {
            assert!(may_matter(text), "{}", String::from_utf8_lossy(text));
        }
    }
}

#[cfg(test)]
mod custom_name_tests {
    use super::*;

    #[test]
    fn finds_custom_setting_names() {
        assert_eq!(
            custom_names(
                b"SET app.Tenant = 1; select set_config( 'my.x', 'v', false), set_config('work_mem', '1MB', false)"
            ),
            ["app.tenant", "my.x"]
        );
        assert_eq!(
            custom_names("SET app.café TO 'x'; RESET \"app\".\"Été\"".as_bytes()),
            ["app.café"]
        );
        // (a quoted name may hold the dot; parts are cut to 63 bytes, as
        // PostgreSQL cuts identifiers; PostgreSQL 16 reads a vertical tab
        // as white space)
        let long = "x".repeat(70);
        assert_eq!(
            custom_names(
                format!("SET \"app.tenant\" = '42'; SET SESSION app.{long} TO 1; SET\x0bapp.v = 2")
                    .as_bytes()
            ),
            [
                "app.tenant".to_owned(),
                format!("app.{}", "x".repeat(63)),
                "app.v".to_owned()
            ]
        );
        // (white space and comments may stand around the dot)
        assert_eq!(
            custom_names(
                b"set app . tenant = 'a'; set session app. x = 1; reset app /* c */ .\"Y\""
            ),
            ["app.tenant", "app.x"]
        );
    }
}
