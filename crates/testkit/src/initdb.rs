//! Creating fresh data directories quickly. `initdb` costs ~0.5 s (mostly
//! importing collations), while copying its result costs a fraction of that,
//! so initdb runs once into a shared template directory (per user, binary
//! directory and testkit version, built atomically by rename) and every
//! cluster gets a copy. Any problem with the template falls back to initdb.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::bin_paths::{bindir, tool};
use crate::cluster::SUPERUSER;
use crate::command::{RunAs, pg_command, run};
use crate::error::TestkitError;
use crate::temp_dir::{PREFIX, TempDir, base_dir, give_to_server_owner};

const INITDB_DEADLINE: Duration = Duration::from_secs(120);
/// Bump when the initdb arguments change, so old templates are not reused.
const TEMPLATE_VERSION: u32 = 1;
/// Written last into a template: the number of entries it holds.
const MARKER: &str = "complete";

/// Fills the not-yet-existing `data_dir` with a freshly initialized cluster.
pub(crate) fn populate(data_dir: &Path) -> Result<(), TestkitError> {
    let template = shared_template()?;
    let copied = copy_tree(&template.join("data"), data_dir);
    if copied.is_ok() && copied.ok() == expected_entries(&template) {
        return Ok(());
    }
    // The template is damaged (e.g. partly deleted by a tmp cleaner): retire it.
    let retired = template.with_extension(format!("retired-{}", std::process::id()));
    if std::fs::rename(&template, &retired).is_ok() {
        let _ = std::fs::remove_dir_all(&retired);
    }
    let _ = std::fs::remove_dir_all(data_dir);
    initdb(data_dir)
}

/// Runs initdb into `data_dir`.
fn initdb(data_dir: &Path) -> Result<(), TestkitError> {
    let mut cmd = pg_command(&tool("initdb")?, RunAs::ServerOwner)?;
    cmd.arg("-D")
        .arg(data_dir)
        .args(["--auth-local=trust", "--auth-host=trust"])
        .args(["-E", "UTF8", "--locale=C", "-U", SUPERUSER, "--no-sync"]);
    run(cmd, INITDB_DEADLINE).map(drop)
}

/// The template directory (holding `data/` and [`MARKER`]), built if missing.
fn shared_template() -> Result<PathBuf, TestkitError> {
    // Threads of one process build it once; other processes may race, and
    // the loser of the rename just uses the winner's template.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _guard = BUILDING.lock().unwrap_or_else(PoisonError::into_inner);
    let template = template_path()?;
    if expected_entries(&template).is_some() {
        return Ok(template);
    }
    let staging = TempDir::create()?;
    let staged_data = staging.path().join("data");
    initdb(&staged_data)?;
    let entries = count_entries(&staged_data)
        .map_err(|e| TestkitError::io(format!("listing {}", staged_data.display()), e))?;
    let marker = staging.path().join(MARKER);
    std::fs::write(&marker, entries.to_string())
        .map_err(|e| TestkitError::io(format!("writing {}", marker.display()), e))?;
    match std::fs::rename(staging.path(), &template) {
        Ok(()) => Ok(template),
        Err(_) if expected_entries(&template).is_some() => Ok(template),
        Err(e) => Err(TestkitError::io(
            format!("moving the initdb template to {}", template.display()),
            e,
        )),
    }
}

/// `<temp>/sluice-testkit-template-v<N>-<euid>-<hash of bindir and initdb>`.
fn template_path() -> Result<PathBuf, TestkitError> {
    let bindir = bindir()?;
    let initdb = bindir.join("initdb");
    let modified = std::fs::metadata(&initdb)
        .and_then(|m| m.modified())
        .map_err(|e| TestkitError::io(format!("inspecting {}", initdb.display()), e))?;
    let mut hasher = std::hash::DefaultHasher::new();
    (bindir, modified).hash(&mut hasher);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    Ok(base_dir().join(format!(
        "{PREFIX}template-v{TEMPLATE_VERSION}-{euid}-{:016x}",
        hasher.finish()
    )))
}

/// The entry count recorded in a complete template, `None` if incomplete.
fn expected_entries(template: &Path) -> Option<u64> {
    std::fs::read_to_string(template.join(MARKER))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn count_entries(dir: &Path) -> std::io::Result<u64> {
    let mut count = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        count += 1;
        if entry.file_type()?.is_dir() {
            count += count_entries(&entry.path())?;
        }
    }
    Ok(count)
}

/// Copies directories and regular files (modes included, owned by the server
/// owner); returns how many entries were copied.
fn copy_tree(from: &Path, to: &Path) -> Result<u64, TestkitError> {
    let io = |what: &str, path: &Path| {
        let context = format!("{what} {}", path.display());
        move |e| TestkitError::io(context, e)
    };
    std::fs::create_dir(to).map_err(io("creating", to))?;
    let permissions = std::fs::metadata(from)
        .map_err(io("inspecting", from))?
        .permissions();
    std::fs::set_permissions(to, permissions).map_err(io("setting the mode of", to))?;
    give_to_server_owner(to)?;
    let mut count = 0;
    for entry in std::fs::read_dir(from).map_err(io("listing", from))? {
        let entry = entry.map_err(io("listing", from))?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io("inspecting", &source))?;
        count += 1;
        if kind.is_dir() {
            count += copy_tree(&source, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target).map_err(io("copying", &source))?;
            give_to_server_owner(&target)?;
        } else {
            return Err(TestkitError::InvalidArgument(format!(
                "unexpected file type in the initdb template: {}",
                source.display()
            )));
        }
    }
    Ok(count)
}
