//! PostgreSQL's keyword list (as of PostgreSQL 17, plus a few words later
//! releases added), with the category the grammar gives each word. The router
//! needs the categories to tell a function call from syntax: a reserved or
//! column-name keyword followed by `(` can never call a user function, and a
//! word that is no keyword at all can only be an alias when it follows a
//! complete operand. Listing a word that is not a keyword only makes the
//! router more cautious, so the few additions are safe.

/// How the grammar may use a keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Category {
    /// May name a column, function, type or alias.
    Unreserved,
    /// May name a column or type, never (unqualified) a function.
    ColName,
    /// May name a function or type, not a column.
    TypeFunc,
    /// Syntax only.
    Reserved,
}

use Category::{ColName, Reserved, TypeFunc, Unreserved};

/// Sorted by byte order, looked up by binary search.
pub(crate) static KEYWORDS: &[(&str, Category)] = &[
    ("abort", Unreserved),
    ("absent", Unreserved),
    ("absolute", Unreserved),
    ("access", Unreserved),
    ("action", Unreserved),
    ("add", Unreserved),
    ("admin", Unreserved),
    ("after", Unreserved),
    ("aggregate", Unreserved),
    ("all", Reserved),
    ("also", Unreserved),
    ("alter", Unreserved),
    ("always", Unreserved),
    ("analyse", Reserved),
    ("analyze", Reserved),
    ("and", Reserved),
    ("any", Reserved),
    ("array", Reserved),
    ("as", Reserved),
    ("asc", Reserved),
    ("asensitive", Unreserved),
    ("assertion", Unreserved),
    ("assignment", Unreserved),
    ("asymmetric", Reserved),
    ("at", Unreserved),
    ("atomic", Unreserved),
    ("attach", Unreserved),
    ("attribute", Unreserved),
    ("authorization", TypeFunc),
    ("backward", Unreserved),
    ("before", Unreserved),
    ("begin", Unreserved),
    ("between", ColName),
    ("bigint", ColName),
    ("binary", TypeFunc),
    ("bit", ColName),
    ("boolean", ColName),
    ("both", Reserved),
    ("breadth", Unreserved),
    ("by", Unreserved),
    ("cache", Unreserved),
    ("call", Unreserved),
    ("called", Unreserved),
    ("cascade", Unreserved),
    ("cascaded", Unreserved),
    ("case", Reserved),
    ("cast", Reserved),
    ("catalog", Unreserved),
    ("chain", Unreserved),
    ("char", ColName),
    ("character", ColName),
    ("characteristics", Unreserved),
    ("check", Reserved),
    ("checkpoint", Unreserved),
    ("class", Unreserved),
    ("close", Unreserved),
    ("cluster", Unreserved),
    ("coalesce", ColName),
    ("collate", Reserved),
    ("collation", TypeFunc),
    ("column", Reserved),
    ("columns", Unreserved),
    ("comment", Unreserved),
    ("comments", Unreserved),
    ("commit", Unreserved),
    ("committed", Unreserved),
    ("compression", Unreserved),
    ("concurrently", TypeFunc),
    ("conditional", Unreserved),
    ("configuration", Unreserved),
    ("conflict", Unreserved),
    ("connection", Unreserved),
    ("constraint", Reserved),
    ("constraints", Unreserved),
    ("content", Unreserved),
    ("continue", Unreserved),
    ("conversion", Unreserved),
    ("copy", Unreserved),
    ("cost", Unreserved),
    ("create", Reserved),
    ("cross", TypeFunc),
    ("csv", Unreserved),
    ("cube", Unreserved),
    ("current", Unreserved),
    ("current_catalog", Reserved),
    ("current_date", Reserved),
    ("current_role", Reserved),
    ("current_schema", TypeFunc),
    ("current_time", Reserved),
    ("current_timestamp", Reserved),
    ("current_user", Reserved),
    ("cursor", Unreserved),
    ("cycle", Unreserved),
    ("data", Unreserved),
    ("database", Unreserved),
    ("day", Unreserved),
    ("deallocate", Unreserved),
    ("dec", ColName),
    ("decimal", ColName),
    ("declare", Unreserved),
    ("default", Reserved),
    ("defaults", Unreserved),
    ("deferrable", Reserved),
    ("deferred", Unreserved),
    ("definer", Unreserved),
    ("delete", Unreserved),
    ("delimiter", Unreserved),
    ("delimiters", Unreserved),
    ("depends", Unreserved),
    ("depth", Unreserved),
    ("desc", Reserved),
    ("detach", Unreserved),
    ("dictionary", Unreserved),
    ("disable", Unreserved),
    ("discard", Unreserved),
    ("distinct", Reserved),
    ("do", Reserved),
    ("document", Unreserved),
    ("domain", Unreserved),
    ("double", Unreserved),
    ("drop", Unreserved),
    ("each", Unreserved),
    ("else", Reserved),
    ("empty", Unreserved),
    ("enable", Unreserved),
    ("encoding", Unreserved),
    ("encrypted", Unreserved),
    ("end", Reserved),
    ("enforced", Unreserved),
    ("enum", Unreserved),
    ("error", Unreserved),
    ("escape", Unreserved),
    ("event", Unreserved),
    ("except", Reserved),
    ("exclude", Unreserved),
    ("excluding", Unreserved),
    ("exclusive", Unreserved),
    ("execute", Unreserved),
    ("exists", ColName),
    ("explain", Unreserved),
    ("expression", Unreserved),
    ("extension", Unreserved),
    ("external", Unreserved),
    ("extract", ColName),
    ("false", Reserved),
    ("family", Unreserved),
    ("fetch", Reserved),
    ("filter", Unreserved),
    ("finalize", Unreserved),
    ("first", Unreserved),
    ("float", ColName),
    ("following", Unreserved),
    ("for", Reserved),
    ("force", Unreserved),
    ("foreign", Reserved),
    ("format", Unreserved),
    ("forward", Unreserved),
    ("freeze", TypeFunc),
    ("from", Reserved),
    ("full", TypeFunc),
    ("function", Unreserved),
    ("functions", Unreserved),
    ("generated", Unreserved),
    ("global", Unreserved),
    ("grant", Reserved),
    ("granted", Unreserved),
    ("greatest", ColName),
    ("group", Reserved),
    ("grouping", ColName),
    ("groups", Unreserved),
    ("handler", Unreserved),
    ("having", Reserved),
    ("header", Unreserved),
    ("hold", Unreserved),
    ("hour", Unreserved),
    ("identity", Unreserved),
    ("if", Unreserved),
    ("ilike", TypeFunc),
    ("immediate", Unreserved),
    ("immutable", Unreserved),
    ("implicit", Unreserved),
    ("import", Unreserved),
    ("in", Reserved),
    ("include", Unreserved),
    ("including", Unreserved),
    ("increment", Unreserved),
    ("indent", Unreserved),
    ("index", Unreserved),
    ("indexes", Unreserved),
    ("inherit", Unreserved),
    ("inherits", Unreserved),
    ("initially", Reserved),
    ("inline", Unreserved),
    ("inner", TypeFunc),
    ("inout", ColName),
    ("input", Unreserved),
    ("insensitive", Unreserved),
    ("insert", Unreserved),
    ("instead", Unreserved),
    ("int", ColName),
    ("integer", ColName),
    ("intersect", Reserved),
    ("interval", ColName),
    ("into", Reserved),
    ("invoker", Unreserved),
    ("is", TypeFunc),
    ("isnull", TypeFunc),
    ("isolation", Unreserved),
    ("join", TypeFunc),
    ("json", ColName),
    ("json_array", ColName),
    ("json_arrayagg", ColName),
    ("json_exists", ColName),
    ("json_object", ColName),
    ("json_objectagg", ColName),
    ("json_query", ColName),
    ("json_scalar", ColName),
    ("json_serialize", ColName),
    ("json_table", ColName),
    ("json_value", ColName),
    ("keep", Unreserved),
    ("key", Unreserved),
    ("keys", Unreserved),
    ("label", Unreserved),
    ("language", Unreserved),
    ("large", Unreserved),
    ("last", Unreserved),
    ("lateral", Reserved),
    ("leading", Reserved),
    ("leakproof", Unreserved),
    ("least", ColName),
    ("left", TypeFunc),
    ("level", Unreserved),
    ("like", TypeFunc),
    ("limit", Reserved),
    ("listen", Unreserved),
    ("load", Unreserved),
    ("local", Unreserved),
    ("localtime", Reserved),
    ("localtimestamp", Reserved),
    ("location", Unreserved),
    ("lock", Unreserved),
    ("locked", Unreserved),
    ("logged", Unreserved),
    ("lsn", Unreserved),
    ("mapping", Unreserved),
    ("match", Unreserved),
    ("matched", Unreserved),
    ("materialized", Unreserved),
    ("maxvalue", Unreserved),
    ("merge", Unreserved),
    ("merge_action", ColName),
    ("method", Unreserved),
    ("minute", Unreserved),
    ("minvalue", Unreserved),
    ("mode", Unreserved),
    ("month", Unreserved),
    ("move", Unreserved),
    ("name", Unreserved),
    ("names", Unreserved),
    ("national", ColName),
    ("natural", TypeFunc),
    ("nchar", ColName),
    ("nested", Unreserved),
    ("new", Unreserved),
    ("next", Unreserved),
    ("nfc", Unreserved),
    ("nfd", Unreserved),
    ("nfkc", Unreserved),
    ("nfkd", Unreserved),
    ("no", Unreserved),
    ("none", ColName),
    ("normalize", ColName),
    ("normalized", Unreserved),
    ("not", Reserved),
    ("nothing", Unreserved),
    ("notify", Unreserved),
    ("notnull", TypeFunc),
    ("nowait", Unreserved),
    ("null", Reserved),
    ("nullif", ColName),
    ("nulls", Unreserved),
    ("numeric", ColName),
    ("object", Unreserved),
    ("objects", Unreserved),
    ("of", Unreserved),
    ("off", Unreserved),
    ("offset", Reserved),
    ("oids", Unreserved),
    ("old", Unreserved),
    ("omit", Unreserved),
    ("on", Reserved),
    ("only", Reserved),
    ("operator", Unreserved),
    ("option", Unreserved),
    ("options", Unreserved),
    ("or", Reserved),
    ("order", Reserved),
    ("ordinality", Unreserved),
    ("others", Unreserved),
    ("out", ColName),
    ("outer", TypeFunc),
    ("over", Unreserved),
    ("overlaps", TypeFunc),
    ("overlay", ColName),
    ("overriding", Unreserved),
    ("owned", Unreserved),
    ("owner", Unreserved),
    ("parallel", Unreserved),
    ("parameter", Unreserved),
    ("parser", Unreserved),
    ("partial", Unreserved),
    ("partition", Unreserved),
    ("passing", Unreserved),
    ("password", Unreserved),
    ("path", Unreserved),
    ("period", Unreserved),
    ("placing", Reserved),
    ("plan", Unreserved),
    ("plans", Unreserved),
    ("policy", Unreserved),
    ("position", ColName),
    ("preceding", Unreserved),
    ("precision", ColName),
    ("prepare", Unreserved),
    ("prepared", Unreserved),
    ("preserve", Unreserved),
    ("primary", Reserved),
    ("prior", Unreserved),
    ("privileges", Unreserved),
    ("procedural", Unreserved),
    ("procedure", Unreserved),
    ("procedures", Unreserved),
    ("program", Unreserved),
    ("publication", Unreserved),
    ("quote", Unreserved),
    ("quotes", Unreserved),
    ("range", Unreserved),
    ("read", Unreserved),
    ("real", ColName),
    ("reassign", Unreserved),
    ("recheck", Unreserved),
    ("recursive", Unreserved),
    ("ref", Unreserved),
    ("references", Reserved),
    ("referencing", Unreserved),
    ("refresh", Unreserved),
    ("reindex", Unreserved),
    ("relative", Unreserved),
    ("release", Unreserved),
    ("rename", Unreserved),
    ("repeatable", Unreserved),
    ("replace", Unreserved),
    ("replica", Unreserved),
    ("reset", Unreserved),
    ("restart", Unreserved),
    ("restrict", Unreserved),
    ("return", Unreserved),
    ("returning", Reserved),
    ("returns", Unreserved),
    ("revoke", Unreserved),
    ("right", TypeFunc),
    ("role", Unreserved),
    ("rollback", Unreserved),
    ("rollup", Unreserved),
    ("routine", Unreserved),
    ("routines", Unreserved),
    ("row", ColName),
    ("rows", Unreserved),
    ("rule", Unreserved),
    ("savepoint", Unreserved),
    ("scalar", Unreserved),
    ("schema", Unreserved),
    ("schemas", Unreserved),
    ("scroll", Unreserved),
    ("search", Unreserved),
    ("second", Unreserved),
    ("security", Unreserved),
    ("select", Reserved),
    ("sequence", Unreserved),
    ("sequences", Unreserved),
    ("serializable", Unreserved),
    ("server", Unreserved),
    ("session", Unreserved),
    ("session_user", Reserved),
    ("set", Unreserved),
    ("setof", ColName),
    ("sets", Unreserved),
    ("share", Unreserved),
    ("show", Unreserved),
    ("similar", TypeFunc),
    ("simple", Unreserved),
    ("skip", Unreserved),
    ("smallint", ColName),
    ("snapshot", Unreserved),
    ("some", Reserved),
    ("source", Unreserved),
    ("sql", Unreserved),
    ("stable", Unreserved),
    ("standalone", Unreserved),
    ("start", Unreserved),
    ("statement", Unreserved),
    ("statistics", Unreserved),
    ("stdin", Unreserved),
    ("stdout", Unreserved),
    ("storage", Unreserved),
    ("stored", Unreserved),
    ("strict", Unreserved),
    ("string", Unreserved),
    ("strip", Unreserved),
    ("subscription", Unreserved),
    ("substring", ColName),
    ("support", Unreserved),
    ("symmetric", Reserved),
    ("sysid", Unreserved),
    ("system", Unreserved),
    ("system_user", Reserved),
    ("table", Reserved),
    ("tables", Unreserved),
    ("tablesample", TypeFunc),
    ("tablespace", Unreserved),
    ("target", Unreserved),
    ("temp", Unreserved),
    ("template", Unreserved),
    ("temporary", Unreserved),
    ("text", Unreserved),
    ("then", Reserved),
    ("ties", Unreserved),
    ("time", ColName),
    ("timestamp", ColName),
    ("to", Reserved),
    ("trailing", Reserved),
    ("transaction", Unreserved),
    ("transform", Unreserved),
    ("treat", ColName),
    ("trigger", Unreserved),
    ("trim", ColName),
    ("true", Reserved),
    ("truncate", Unreserved),
    ("trusted", Unreserved),
    ("type", Unreserved),
    ("types", Unreserved),
    ("uescape", Unreserved),
    ("unbounded", Unreserved),
    ("uncommitted", Unreserved),
    ("unconditional", Unreserved),
    ("unencrypted", Unreserved),
    ("union", Reserved),
    ("unique", Reserved),
    ("unknown", Unreserved),
    ("unlisten", Unreserved),
    ("unlogged", Unreserved),
    ("until", Unreserved),
    ("update", Unreserved),
    ("user", Reserved),
    ("using", Reserved),
    ("vacuum", Unreserved),
    ("valid", Unreserved),
    ("validate", Unreserved),
    ("validator", Unreserved),
    ("value", Unreserved),
    ("values", ColName),
    ("varchar", ColName),
    ("variadic", Reserved),
    ("varying", Unreserved),
    ("verbose", TypeFunc),
    ("version", Unreserved),
    ("view", Unreserved),
    ("views", Unreserved),
    ("virtual", Unreserved),
    ("volatile", Unreserved),
    ("wait", Unreserved),
    ("when", Reserved),
    ("where", Reserved),
    ("whitespace", Unreserved),
    ("window", Reserved),
    ("with", Reserved),
    ("within", Unreserved),
    ("without", Unreserved),
    ("work", Unreserved),
    ("wrapper", Unreserved),
    ("write", Unreserved),
    ("xml", Unreserved),
    ("xmlattributes", ColName),
    ("xmlconcat", ColName),
    ("xmlelement", ColName),
    ("xmlexists", ColName),
    ("xmlforest", ColName),
    ("xmlnamespaces", ColName),
    ("xmlparse", ColName),
    ("xmlpi", ColName),
    ("xmlroot", ColName),
    ("xmlserialize", ColName),
    ("xmltable", ColName),
    ("year", Unreserved),
    ("yes", Unreserved),
    ("zone", Unreserved),
];

/// The longest keyword, `current_timestamp`.
const LONGEST: usize = 17;

/// A keyword's text packed into integers so that the table compares numbers
/// instead of calling `memcmp`: bytes 0 to 7, 8 to 15 (zero-padded), then
/// the 17th. `None` unless every byte is an ASCII letter or `_`; letters are
/// folded to lower case on the way.
type Packed = (u64, u64, u8);

fn pack(word: &[u8]) -> Option<Packed> {
    if word.len() > LONGEST {
        return None;
    }
    let mut key = (0u64, 0u64, 0u8);
    for (i, &b) in word.iter().enumerate() {
        if !(b.is_ascii_alphabetic() || b == b'_') {
            return None;
        }
        let b = b.to_ascii_lowercase();
        match i {
            0..8 => key.0 |= u64::from(b) << (8 * i),
            8..16 => key.1 |= u64::from(b) << (8 * (i - 8)),
            _ => key.2 = b,
        }
    }
    Some(key)
}

/// Slots in the lookup table: a power of two, about twice the number of
/// keywords so that probes are short.
const SLOTS: usize = 1024;
const EMPTY: u16 = u16::MAX;

fn slot(key: Packed) -> usize {
    let folded = key.0 ^ key.1.rotate_left(29) ^ u64::from(key.2);
    (folded.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
}

/// An open-addressing hash table from packed keyword text to its index in
/// [`KEYWORDS`]; a binary search over the list cost more than the rest of
/// the tokenizer.
static TABLE: std::sync::LazyLock<Vec<(Packed, u16)>> = std::sync::LazyLock::new(|| {
    let mut table = vec![((0, 0, 0), EMPTY); SLOTS];
    for (i, (name, _)) in KEYWORDS.iter().enumerate() {
        // Every keyword packs: letters and `_`, at most 17 bytes.
        let Some(key) = pack(name.as_bytes()) else {
            continue;
        };
        let mut s = slot(key);
        while table[s].1 != EMPTY {
            s = (s + 1) % SLOTS;
        }
        // KEYWORDS has far fewer than u16::MAX entries.
        table[s] = (key, i as u16);
    }
    table
});

/// The index in [`KEYWORDS`] of an unquoted identifier's text, compared
/// case-insensitively (ASCII only, as PostgreSQL does for keywords).
pub(crate) fn lookup(word: &[u8]) -> Option<u16> {
    let key = pack(word)?;
    let mut s = slot(key);
    loop {
        let &(k, i) = TABLE.get(s)?;
        if i == EMPTY {
            return None;
        }
        if k == key {
            return Some(i);
        }
        s = (s + 1) % SLOTS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_unique() {
        for pair in KEYWORDS.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{} >= {}", pair[0].0, pair[1].0);
        }
    }

    #[test]
    fn every_keyword_is_found() {
        for (i, (name, _)) in KEYWORDS.iter().enumerate() {
            assert_eq!(lookup(name.as_bytes()).map(usize::from), Some(i), "{name}");
            assert_eq!(
                lookup(name.to_uppercase().as_bytes()).map(usize::from),
                Some(i),
                "{name}"
            );
        }
    }

    #[test]
    fn finds_case_insensitively() {
        let i = lookup(b"SeLeCt").map(usize::from);
        assert_eq!(i.map(|i| KEYWORDS[i]), Some(("select", Reserved)));
        assert_eq!(lookup(b"selects"), None);
        assert_eq!(lookup(b"current_timestamp_x"), None);
        assert!(lookup(b"zone").is_some());
        assert!(lookup(b"abort").is_some());
    }
}
