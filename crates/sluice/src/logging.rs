//! Log output: stderr (unless -q or -d), `logfile` (opened again by every
//! RELOAD, for log rotation) and syslog (`syslog`, `syslog_ident`,
//! `syslog_facility`; changed by RELOAD), at a level from `verbose` and -v,
//! in a PgBouncer-like one-line format.

use std::sync::Mutex;

use tracing::Level;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

/// Starts logging. Fails only when the log file cannot be opened.
pub fn init(logfile: &str, to_stderr: bool, verbosity: u32) -> std::io::Result<()> {
    let level = match verbosity {
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    };
    reopen(logfile)?;
    let writer = match to_stderr {
        true => BoxMakeWriter::new(OneLine(std::io::stderr.and(|| LogFile).and(Syslog))),
        false => BoxMakeWriter::new(OneLine((|| LogFile).and(Syslog))),
    };
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_max_level(level)
        .with_ansi(false)
        .with_target(false)
        .init();
    Ok(())
}

/// Every event on one line: a line break inside one (in a user name a
/// client chose, say) is written `\n`, so that no client can forge a log
/// line (found by a review).
struct OneLine<M>(M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for OneLine<M>
{
    type Writer = OneLineWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        OneLineWriter(self.0.make_writer_for(meta))
    }
}

/// Writes each event (one `write_all`) with its inner line breaks escaped.
struct OneLineWriter<W>(W);

impl<W: std::io::Write> std::io::Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let line = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !line.iter().any(|&b| b == b'\n' || b == b'\r') {
            return self.0.write_all(buf);
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in line {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b => out.push(b),
            }
        }
        if line.len() < buf.len() {
            out.push(b'\n');
        }
        self.0.write_all(&out)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The open `logfile`, if one is set.
static LOGFILE: Mutex<Option<std::fs::File>> = Mutex::new(None);

/// Opens `logfile` (again): at startup, and at every RELOAD, so that a
/// log rotated away (moved, then SIGHUP, as PgBouncer's documentation and
/// logrotate's `postrotate` do) goes on in a new file, and a changed path
/// takes effect. Empty: no file from now on. On an error the file in use
/// stays.
pub fn reopen(logfile: &str) -> std::io::Result<()> {
    let file = match logfile {
        "" => None,
        path => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
    };
    *LOGFILE.lock().unwrap_or_else(|p| p.into_inner()) = file;
    Ok(())
}

/// Writes a log line to the current `logfile` (none set: nowhere).
struct LogFile;

impl std::io::Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LOGFILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.write(buf),
            None => Ok(buf.len()),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        // One lock for the whole line, so that lines of two threads do not
        // interleave.
        match LOGFILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.write_all(buf),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match LOGFILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// Where syslog lines go while `syslog` is on: the local syslog socket
/// (`/dev/log`, or `$SLUICE_SYSLOG_SOCKET`), one datagram per line in the
/// format glibc's syslog(3) sends.
struct SyslogTarget {
    path: std::path::PathBuf,
    ident: String,
    facility: u8,
}

static SYSLOG: Mutex<Option<SyslogTarget>> = Mutex::new(None);
/// `syslog` is on (checked before taking the lock: most lines need none).
static SYSLOG_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The facility number of a `syslog_facility` name (PgBouncer's list).
pub fn facility_code(name: &str) -> Option<u8> {
    Some(match name.to_ascii_lowercase().as_str() {
        "kern" => 0,
        "user" => 1,
        "mail" => 2,
        "daemon" => 3,
        "auth" => 4,
        "syslog" => 5,
        "lpr" => 6,
        "news" => 7,
        "uucp" => 8,
        "cron" => 9,
        "authpriv" => 10,
        "ftp" => 11,
        local => {
            let n: u8 = local.strip_prefix("local")?.parse().ok()?;
            if n > 7 {
                return None;
            }
            16 + n
        }
    })
}

/// Applies `syslog`, `syslog_ident` and `syslog_facility` (at startup and
/// on RELOAD). The facility is checked at startup (`check_supported`).
pub fn configure_syslog(s: &sluice_config::Settings) {
    let target = if s.syslog {
        let path = std::env::var_os("SLUICE_SYSLOG_SOCKET")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/dev/log".into());
        Some(SyslogTarget {
            path,
            ident: s.syslog_ident.clone(),
            facility: facility_code(&s.syslog_facility).unwrap_or(3),
        })
    } else {
        None
    };
    SYSLOG_ON.store(target.is_some(), std::sync::atomic::Ordering::Relaxed);
    *SYSLOG.lock().unwrap_or_else(|p| p.into_inner()) = target;
}

/// Makes one `SyslogLine` per event, knowing its level.
struct Syslog;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Syslog {
    type Writer = SyslogLine;

    fn make_writer(&'a self) -> SyslogLine {
        SyslogLine {
            severity: 6,
            line: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> SyslogLine {
        let severity = match *meta.level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            _ => 7,
        };
        SyslogLine {
            severity,
            line: Vec::new(),
        }
    }
}

/// One formatted event, sent when complete (dropped).
struct SyslogLine {
    severity: u8,
    line: Vec<u8>,
}

impl std::io::Write for SyslogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !SYSLOG_ON.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(buf.len());
        }
        // Bounded: syslog datagrams are small; the rest is cut.
        let room = MAX_SYSLOG_LINE.saturating_sub(self.line.len());
        self.line.extend_from_slice(&buf[..buf.len().min(room)]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Longest line sent to syslog.
const MAX_SYSLOG_LINE: usize = 8 * 1024;

impl Drop for SyslogLine {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let guard = SYSLOG.lock().unwrap_or_else(|p| p.into_inner());
        let Some(target) = guard.as_ref() else {
            return;
        };
        let text = String::from_utf8_lossy(&self.line);
        // The formatter's "<time>  <LEVEL> " prefix: syslog has its own.
        let message = text
            .trim_end()
            .split_once(char::is_whitespace)
            .map(|(_, rest)| rest.trim_start())
            .and_then(|rest| rest.split_once(char::is_whitespace))
            .map_or(text.trim_end(), |(_, rest)| rest.trim_start());
        let datagram = format!(
            "<{}>{} {}[{}]: {}",
            u32::from(target.facility) * 8 + u32::from(self.severity),
            rfc3164_now(),
            target.ident,
            std::process::id(),
            message
        );
        // Nothing to tell if syslog is not listening: the line is lost,
        // as with syslog(3). Never blocks: a stuck syslog daemon loses
        // lines rather than stalling sluice.
        if let Ok(socket) = std::os::unix::net::UnixDatagram::unbound()
            && socket.set_nonblocking(true).is_ok()
        {
            let _ = socket.send_to(datagram.as_bytes(), &target.path);
        }
    }
}

/// "Mmm dd hh:mm:ss" in UTC, the timestamp syslog(3) sends.
fn rfc3164_now() -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (_, month, day) = civil_date(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{} {:>2} {:02}:{:02}:{:02}",
        MONTHS[(month - 1) as usize],
        day,
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// (year, month 1-12, day 1-31) of a day counted from 1970-01-01 (Howard
/// Hinnant's algorithm), for the log and the console's timestamps.
pub fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_event_stays_one_line() {
        use std::io::Write;
        let mut w = super::OneLineWriter(Vec::new());
        w.write_all(b"login attempt: user=evil\nFORGED line\r\n")
            .expect("write");
        assert_eq!(w.0, b"login attempt: user=evil\\nFORGED line\\r\n");
        let mut plain = super::OneLineWriter(Vec::new());
        plain.write_all(b"a line\n").expect("write");
        assert_eq!(plain.0, b"a line\n");
    }

    use super::*;

    #[test]
    fn facilities_are_pgbouncers() {
        assert_eq!(facility_code("daemon"), Some(3));
        assert_eq!(facility_code("AUTHPRIV"), Some(10));
        assert_eq!(facility_code("local0"), Some(16));
        assert_eq!(facility_code("local7"), Some(23));
        assert_eq!(facility_code("local8"), None);
        assert_eq!(facility_code("nonsense"), None);
    }

    #[test]
    fn the_timestamp_has_syslogs_shape() {
        let t = rfc3164_now();
        assert_eq!(t.len(), 15, "{t}");
        assert!(MONTHS_OK.contains(&&t[..3]), "{t}");
    }

    const MONTHS_OK: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
}
