//! docs/config.md must be exactly what `reference_markdown()` generates.
//! Run with `UPDATE_DOCS=1` to rewrite it.

const DOCS_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");

#[test]
fn docs_config_md_is_up_to_date() {
    let generated = sluice_config::reference_markdown();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(DOCS_PATH, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(DOCS_PATH).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/config.md is stale; regenerate it with \
         UPDATE_DOCS=1 cargo test -p sluice-config --test docs_fresh"
    );
}

#[test]
fn docs_mention_every_key() {
    let generated = sluice_config::reference_markdown();
    for info in sluice_config::known_keys() {
        assert!(
            generated.contains(&format!("| `{}` |", info.key)),
            "{}",
            info.key
        );
    }
}
