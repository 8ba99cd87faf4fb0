//! The original scheduler's command lines, as operators wrote them for gflags,
//! rewritten into what clap parses. One pass over argv, before clap:
//!
//! - `--flagfile=FILE` (or `--flagfile FILE`) is replaced by the flags in
//!   FILE: one per line, leading whitespace skipped, `#` starts a comment line,
//!   the rest of the line taken literally (gflags does not trim the end either).
//! - `--fromenv=a,b` reads the flags `a` and `b` from the environment
//!   variables `FLAGS_a` and `FLAGS_b`, in place (a later flag overrides
//!   them); a variable that is not set is an error. `--tryfromenv` is the
//!   same without that error. Both name flags this program defines.
//! - `-name`, `-name=value`, `-name value` are `--name...` (single-character
//!   names such as `-h` stay clap's short flags, except glog's `-v`).
//! - Booleans: `--flag`, `--noflag`, `--flag=true|false` (also `1/0`, `yes/no`,
//!   `t/f`, `y/n`); the last occurrence wins, as in gflags, also over the
//!   flag's `YADCC_*` variable (see [`switch`]).
//! - gflags' `--helpfull` and `--helpshort` show the usage, as `--help` does
//!   (this program has one module, so all three show the same).
//! - Flags of the original's logging library (glog) and RPC framework
//!   (`--flare_*`) are dropped with a warning: they have no effect here.
//!
//! Everything else passes through unchanged, so clap still rejects a typo.

use std::{
    collections::{BTreeMap, VecDeque},
    ffi::OsString,
    path::Path,
};

use clap::{
    Arg, ArgAction, Command,
    builder::{BoolishValueParser, ValueParser},
};

/// Flag files read per command line, nested ones included: a file that
/// includes itself is an error, not a hang.
pub const MAX_FLAGFILES: usize = 64;
/// Largest flag file read.
pub const MAX_FLAGFILE_BYTES: u64 = 1 << 20;
/// `--fromenv`/`--tryfromenv` expansions per command line: a variable that
/// names itself again (`FLAGS_fromenv=fromenv,port`) is an error, not a hang.
pub const MAX_FROMENV: usize = 64;
/// Prefix of the variables `--fromenv` reads (`FLAGS_port`), as gflags names them.
const FROMENV_PREFIX: &str = "FLAGS_";
/// gflags' help flags that show the whole usage, as `--help` does here.
const HELP_FLAGS: &[&str] = &["helpfull", "helpshort"];

/// glog's flags that take no value (`--logtostderr`, `--nologtostderr`).
const GLOG_BOOLEANS: &[&str] = &[
    "logtostderr",
    "logtostdout",
    "alsologtostderr",
    "colorlogtostderr",
    "colorlogtostdout",
    "drop_log_memory",
    "log_prefix",
    "log_year_in_prefix",
    "log_utc_time",
    "log_file_header",
    "timestamp_in_logfile_name",
    "stop_logging_if_full_disk",
    "symbolize_stacktrace",
];

/// glog's flags that take a value (`--v=2`, `--log_dir /var/log`).
const GLOG_VALUED: &[&str] = &[
    "v",
    "vmodule",
    "log_dir",
    "log_link",
    "logfile_mode",
    "max_log_size",
    "minloglevel",
    "stderrthreshold",
    "logbuflevel",
    "logbufsecs",
    "logcleansecs",
    "logemaillevel",
    "logmailer",
    "alsologtoemail",
    "log_backtrace_at",
    // gflags' own: names flags that may be undefined, which all of these are.
    "undefok",
];

/// argv rewritten for clap, and what the operator should be told once logging
/// is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalised {
    /// Program name first, as clap expects.
    pub args: Vec<OsString>,
    /// One line per flag that was accepted but has no effect.
    pub warnings: Vec<String>,
}

/// A boolean flag as gflags has them: `--name`, `--name=true|false` and,
/// through [`normalise`], `--noname`. clap's plain switch (`SetTrue`) cannot
/// be set to false on the command line, so a `YADCC_*` variable saying true
/// would win over `--noname`; this form takes an explicit value.
/// A switch declared on by default (`default_value_t = true`) stays on.
pub fn switch(arg: Arg) -> Arg {
    let on = arg.get_default_values().iter().any(|value| value == "true");
    arg.action(ArgAction::Set)
        .num_args(0..=1)
        .require_equals(true)
        .default_missing_value("true")
        .default_value(if on { "true" } else { "false" })
        .value_name("true|false")
        .value_parser(BoolishValueParser::new())
}

/// Whether `arg` is a boolean (made by [`switch`]).
fn is_switch(arg: &Arg) -> bool {
    arg.get_value_parser().type_id() == ValueParser::bool().type_id()
}

/// The flags `command` defines: every long name and alias, and whether it is a
/// switch ([`switch`]).
struct KnownFlags {
    switches: BTreeMap<String, String>,
    valued: Vec<String>,
}

impl KnownFlags {
    fn of(command: &Command) -> Self {
        let mut switches = BTreeMap::new();
        let mut valued = Vec::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let names = std::iter::once(long).chain(arg.get_all_aliases().unwrap_or_default());
            for name in names {
                if is_switch(arg) {
                    switches.insert(name.to_owned(), long.to_owned());
                } else if arg.get_action().takes_values() {
                    valued.push(name.to_owned());
                }
            }
        }
        KnownFlags { switches, valued }
    }

    /// Whether gflags would know `name`: this program's flags, the framework's
    /// (accepted and ignored) and gflags' own.
    fn defines(&self, name: &str) -> bool {
        self.switches.contains_key(name)
            || self.valued.iter().any(|known| known == name)
            || framework_flag(name).is_some()
            || ["flagfile", "fromenv", "tryfromenv"].contains(&name)
            || HELP_FLAGS.contains(&name)
    }
}

/// Rewrites `args` (program name first) for `command`; `env` reads the
/// variables `--fromenv` names. Errors name the flag or file at fault.
pub fn normalise(
    command: &Command,
    args: impl IntoIterator<Item = OsString>,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<Normalised, String> {
    let mut queue: VecDeque<OsString> = args.into_iter().collect();
    let mut rewrite = Rewrite {
        known: KnownFlags::of(command),
        out: queue.pop_front().into_iter().collect(),
        queue,
        warnings: Vec::new(),
        switches: BTreeMap::new(),
        flagfiles_read: 0,
        fromenv_read: 0,
    };
    // What follows `--`, kept for the very end.
    let mut after_double_dash = Vec::new();
    while let Some(arg) = rewrite.queue.pop_front() {
        let Some(text) = arg.to_str() else {
            rewrite.out.push(arg);
            continue;
        };
        if text == "--" {
            after_double_dash.push(arg);
            after_double_dash.extend(rewrite.queue.drain(..));
            break;
        }
        let Some(body) = flag_body(text) else {
            rewrite.out.push(arg);
            continue;
        };
        rewrite.flag(body, &env)?;
    }
    Ok(rewrite.finish(after_double_dash))
}

/// One pass of [`normalise`]: the words left to read (files and variables
/// insert theirs in front) and what is written so far.
struct Rewrite {
    known: KnownFlags,
    queue: VecDeque<OsString>,
    out: Vec<OsString>,
    warnings: Vec<String>,
    /// Canonical switch name -> its last value.
    switches: BTreeMap<String, bool>,
    flagfiles_read: usize,
    fromenv_read: usize,
}

impl Rewrite {
    /// One flag, `body` without its dashes.
    fn flag(&mut self, body: &str, env: &impl Fn(&str) -> Option<OsString>) -> Result<(), String> {
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        if name == "flagfile" {
            return self.flagfile(name, value);
        }
        if name == "fromenv" || name == "tryfromenv" {
            return self.fromenv(name, value, env);
        }
        if HELP_FLAGS.contains(&name) {
            let on = value
                .map_or(Some(true), parse_bool)
                .ok_or_else(|| format!("--{body}: expected true or false"))?;
            if on {
                self.out.push("--help".into());
            }
            return Ok(());
        }
        if self.own_flag(name, value, body)? {
            return Ok(());
        }
        if let Some((framework, instead)) = framework_flag(name) {
            self.skip_framework_flag(name, value, framework, instead);
            return Ok(());
        }
        // Unknown: clap says so, with its suggestions.
        self.out.push(format!("--{body}").into());
        Ok(())
    }

    /// Puts `words` in front of what is left to read, in order.
    fn read_next(&mut self, words: Vec<String>) {
        for (index, word) in words.into_iter().enumerate() {
            self.queue.insert(index, word.into());
        }
    }

    fn flagfile(&mut self, name: &str, value: Option<&str>) -> Result<(), String> {
        let path = value_or_next(name, value, &mut self.queue)?;
        self.flagfiles_read += 1;
        if self.flagfiles_read > MAX_FLAGFILES {
            return Err(format!(
                "more than {MAX_FLAGFILES} --flagfile files (does {path} include itself?)"
            ));
        }
        let lines = read_flagfile(Path::new(&path))?;
        self.read_next(lines);
        Ok(())
    }

    fn fromenv(
        &mut self,
        name: &str,
        value: Option<&str>,
        env: &impl Fn(&str) -> Option<OsString>,
    ) -> Result<(), String> {
        let list = value_or_next(name, value, &mut self.queue)?;
        self.fromenv_read += 1;
        if self.fromenv_read > MAX_FROMENV {
            return Err(format!(
                "more than {MAX_FROMENV} --fromenv/--tryfromenv lists (does a FLAGS_ variable name itself?)"
            ));
        }
        let flags = from_environment(&self.known, name == "fromenv", &list, env)
            .map_err(|error| format!("--{name}={list}: {error}"))?;
        self.read_next(flags);
        Ok(())
    }

    /// A flag of this program's (a switch, its `--noname`, or a flag with a
    /// value); false if `name` is none of them.
    fn own_flag(&mut self, name: &str, value: Option<&str>, body: &str) -> Result<bool, String> {
        if let Some(canonical) = self.known.switches.get(name) {
            let on = match value {
                None => true,
                Some(value) => parse_bool(value)
                    .ok_or_else(|| format!("--{name}={value}: expected true or false"))?,
            };
            self.switches.insert(canonical.clone(), on);
            return Ok(true);
        }
        if let Some(canonical) = name
            .strip_prefix("no")
            .and_then(|n| self.known.switches.get(n))
            && value.is_none()
        {
            self.switches.insert(canonical.clone(), false);
            return Ok(true);
        }
        if !self.known.valued.iter().any(|known| known == name) {
            return Ok(false);
        }
        // gflags' `--name value` takes the next word whatever it looks
        // like (a token may start with `-`); joined, clap reads it so too.
        let next = if value.is_none() {
            self.queue.pop_front()
        } else {
            None
        };
        match next {
            Some(next) => {
                let mut joined = OsString::from(format!("--{name}="));
                joined.push(next);
                self.out.push(joined);
            }
            None => self.out.push(format!("--{body}").into()),
        }
        Ok(true)
    }

    /// A flag of the original's framework: a warning, and its value skipped.
    fn skip_framework_flag(
        &mut self,
        name: &str,
        value: Option<&str>,
        framework: &str,
        instead: &str,
    ) {
        self.warnings.push(format!(
            "--{name} is a flag of the original's {framework} and has no effect here ({instead})"
        ));
        let takes_value = !GLOG_BOOLEANS.contains(&name)
            && !name
                .strip_prefix("no")
                .is_some_and(|n| GLOG_BOOLEANS.contains(&n));
        // `--flag value`: the original has no positional arguments, so a
        // following word that is not a flag can only be this flag's value.
        if value.is_none()
            && takes_value
            && self
                .queue
                .front()
                .is_some_and(|next| !next.to_string_lossy().starts_with('-'))
        {
            self.queue.pop_front();
        }
    }

    /// The switches, each once with its last value, then what followed `--`.
    fn finish(mut self, after_double_dash: Vec<OsString>) -> Normalised {
        // False explicitly, so that it also overrides the flag's variable.
        for (name, on) in self.switches {
            self.out.push(if on {
                format!("--{name}").into()
            } else {
                format!("--{name}=false").into()
            });
        }
        self.out.extend(after_double_dash);
        Normalised {
            args: self.out,
            warnings: self.warnings,
        }
    }
}

/// `--name[=value]` or `-name[=value]` without the dashes; None for values,
/// `-`, and single-character short flags (`-h`), except glog's `-v`.
fn flag_body(text: &str) -> Option<&str> {
    if let Some(body) = text.strip_prefix("--") {
        return (!body.is_empty()).then_some(body);
    }
    let body = text.strip_prefix('-')?;
    let name = body.split('=').next().unwrap_or_default();
    (name.len() > 1 || GLOG_VALUED.contains(&name)).then_some(body)
}

/// A valued gflags flag's value: after `=`, else the next word.
fn value_or_next(
    name: &str,
    value: Option<&str>,
    queue: &mut VecDeque<OsString>,
) -> Result<String, String> {
    match value {
        Some(value) => Ok(value.to_owned()),
        None => queue
            .pop_front()
            .and_then(|next| next.into_string().ok())
            .ok_or_else(|| format!("--{name} needs a value")),
    }
}

/// The flags a `--fromenv` (`required`) or `--tryfromenv` list sets, as
/// `--name=value`, in the list's order: each listed flag from its `FLAGS_name`
/// variable. gflags' rules: an empty entry, an entry starting with `-` and a
/// flag nobody defines are errors; a variable holding `fromenv` or
/// `tryfromenv` would recurse forever.
fn from_environment(
    known: &KnownFlags,
    required: bool,
    list: &str,
    env: &impl Fn(&str) -> Option<OsString>,
) -> Result<Vec<String>, String> {
    let mut flags = Vec::new();
    for name in list.split(',') {
        if name.is_empty() {
            return Err("empty entry in the list of flags".to_owned());
        }
        if name.starts_with('-') {
            return Err(format!("flag {name:?} begins with '-'"));
        }
        if !known.defines(name) {
            return Err(format!("unknown command line flag '{name}'"));
        }
        let variable = format!("{FROMENV_PREFIX}{name}");
        let Some(value) = env(&variable) else {
            if required {
                return Err(format!("{variable} not found in environment"));
            }
            continue;
        };
        let value = value
            .into_string()
            .map_err(|_| format!("{variable} is not UTF-8"))?;
        if value == "fromenv" || value == "tryfromenv" {
            return Err(format!(
                "infinite recursion on environment flag '{value}' ({variable})"
            ));
        }
        flags.push(format!("--{name}={value}"));
    }
    Ok(flags)
}

/// gflags' spellings of a boolean.
fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "t" | "yes" | "y" | "1" => Some(true),
        "false" | "f" | "no" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// Which part of the original's stack defines `name`, if it is one we accept
/// and ignore, and what serves its purpose here.
fn framework_flag(name: &str) -> Option<(&'static str, &'static str)> {
    if name.starts_with("flare_") || name.starts_with("noflare_") {
        return Some((
            "RPC framework (flare)",
            "see --help for this scheduler's own limits",
        ));
    }
    let base = name.strip_prefix("no").unwrap_or(name);
    (GLOG_BOOLEANS.contains(&base) || GLOG_VALUED.contains(&name)).then_some((
        "logging library (glog)",
        "logs go to stderr; RUST_LOG chooses what is logged",
    ))
}

/// The flags in a gflags flag file, in order.
fn read_flagfile(path: &Path) -> Result<Vec<String>, String> {
    let shown = path.display();
    let size = std::fs::metadata(path)
        .map_err(|error| format!("--flagfile={shown}: {error}"))?
        .len();
    if size > MAX_FLAGFILE_BYTES {
        return Err(format!(
            "--flagfile={shown}: {size} bytes, more than the {MAX_FLAGFILE_BYTES} a flag file may have"
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("--flagfile={shown}: {error}"))?;
    parse_flagfile(&text).map_err(|error| format!("--flagfile={shown}: {error}"))
}

/// gflags' reading of a flag file's text.
fn parse_flagfile(text: &str) -> Result<Vec<String>, String> {
    let mut flags = Vec::new();
    for (index, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw).trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !line.starts_with('-') {
            // gflags reads such a line as a list of program names the
            // following flags apply to; silently applying or dropping them
            // would both surprise someone.
            return Err(format!(
                "line {}: {line:?} is not a flag; program-name sections are not supported",
                index + 1
            ));
        }
        flags.push(line.to_owned());
    }
    Ok(flags)
}

#[cfg(test)]
mod tests;
