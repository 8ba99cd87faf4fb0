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
pub fn switch(arg: Arg) -> Arg {
    arg.action(ArgAction::Set)
        .num_args(0..=1)
        .require_equals(true)
        .default_missing_value("true")
        .default_value("false")
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
    let known = KnownFlags::of(command);
    let mut queue: VecDeque<OsString> = args.into_iter().collect();
    let mut out: Vec<OsString> = queue.pop_front().into_iter().collect();
    let mut warnings = Vec::new();
    // Canonical switch name -> its last value.
    let mut switches: BTreeMap<String, bool> = BTreeMap::new();
    let mut flagfiles_read = 0;
    let mut fromenv_read = 0;
    // What follows `--`, kept for the very end.
    let mut after_double_dash = Vec::new();

    while let Some(arg) = queue.pop_front() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            after_double_dash.push(arg);
            after_double_dash.extend(queue.drain(..));
            break;
        }
        let Some(body) = flag_body(text) else {
            out.push(arg);
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };

        if name == "flagfile" {
            let path = value_or_next(name, value, &mut queue)?;
            flagfiles_read += 1;
            if flagfiles_read > MAX_FLAGFILES {
                return Err(format!(
                    "more than {MAX_FLAGFILES} --flagfile files (does {path} include itself?)"
                ));
            }
            for (index, line) in read_flagfile(Path::new(&path))?.into_iter().enumerate() {
                queue.insert(index, line.into());
            }
            continue;
        }

        if name == "fromenv" || name == "tryfromenv" {
            let list = value_or_next(name, value, &mut queue)?;
            fromenv_read += 1;
            if fromenv_read > MAX_FROMENV {
                return Err(format!(
                    "more than {MAX_FROMENV} --fromenv/--tryfromenv lists (does a FLAGS_ variable name itself?)"
                ));
            }
            let flags = from_environment(&known, name == "fromenv", &list, &env)
                .map_err(|error| format!("--{name}={list}: {error}"))?;
            for (index, flag) in flags.into_iter().enumerate() {
                queue.insert(index, flag.into());
            }
            continue;
        }

        if HELP_FLAGS.contains(&name) {
            let on = value
                .map_or(Some(true), parse_bool)
                .ok_or_else(|| format!("--{body}: expected true or false"))?;
            if on {
                out.push("--help".into());
            }
            continue;
        }

        if let Some(canonical) = known.switches.get(name) {
            let on = match value {
                None => true,
                Some(value) => parse_bool(value)
                    .ok_or_else(|| format!("--{name}={value}: expected true or false"))?,
            };
            switches.insert(canonical.clone(), on);
            continue;
        }
        if let Some(canonical) = name.strip_prefix("no").and_then(|n| known.switches.get(n))
            && value.is_none()
        {
            switches.insert(canonical.clone(), false);
            continue;
        }
        if known.valued.iter().any(|known| known == name) {
            // gflags' `--name value` takes the next word whatever it looks
            // like (a token may start with `-`); joined, clap reads it so too.
            let next = if value.is_none() {
                queue.pop_front()
            } else {
                None
            };
            match next {
                Some(next) => {
                    let mut joined = OsString::from(format!("--{name}="));
                    joined.push(next);
                    out.push(joined);
                }
                None => out.push(format!("--{body}").into()),
            }
            continue;
        }

        if let Some((framework, instead)) = framework_flag(name) {
            warnings.push(format!(
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
                && queue
                    .front()
                    .is_some_and(|next| !next.to_string_lossy().starts_with('-'))
            {
                queue.pop_front();
            }
            continue;
        }
        // Unknown: clap says so, with its suggestions.
        out.push(format!("--{body}").into());
    }

    // False explicitly, so that it also overrides the flag's variable.
    for (name, on) in switches {
        out.push(if on {
            format!("--{name}").into()
        } else {
            format!("--{name}=false").into()
        });
    }
    out.extend(after_double_dash);
    Ok(Normalised {
        args: out,
        warnings,
    })
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
mod tests {
    use super::*;

    fn command() -> Command {
        Command::new("test")
            .arg(Arg::new("port").long("port"))
            .arg(Arg::new("help").long("help").action(ArgAction::Help))
            .arg(
                Arg::new("tokens")
                    .long("acceptable_user_tokens")
                    .visible_alias("acceptable-user-tokens"),
            )
            .arg(switch(Arg::new("demo").long("demo")))
            .arg(switch(
                Arg::new("open")
                    .long("debugging_no_inspect_auth")
                    .alias("debugging-no-inspect-auth"),
            ))
    }

    /// What `--fromenv` reads in these tests.
    fn environment(name: &str) -> Option<OsString> {
        match name {
            "FLAGS_port" => Some("9000".into()),
            "FLAGS_demo" => Some("true".into()),
            "FLAGS_acceptable_user_tokens" => Some("a,b".into()),
            "FLAGS_v" => Some("2".into()),
            "FLAGS_fromenv" => Some("fromenv".into()),
            "FLAGS_tryfromenv" => Some("tryfromenv,port".into()),
            _ => None,
        }
    }

    fn run(args: &[&str]) -> Result<Normalised, String> {
        normalise(
            &command(),
            std::iter::once("prog")
                .chain(args.iter().copied())
                .map(OsString::from),
            environment,
        )
    }

    fn args(args: &[&str]) -> Vec<String> {
        run(args)
            .unwrap()
            .args
            .into_iter()
            .skip(1)
            .map(|arg| arg.into_string().unwrap())
            .collect()
    }

    #[test]
    fn single_dash_long_flags_become_double_dash() {
        assert_eq!(
            args(&["-port=9000", "-acceptable_user_tokens", "a,b", "-h"]),
            vec!["--port=9000", "--acceptable_user_tokens=a,b", "-h"]
        );
        // gflags takes the next word as the value, even one starting with `-`.
        assert_eq!(
            args(&["--acceptable_user_tokens", "-secret"]),
            vec!["--acceptable_user_tokens=-secret"]
        );
    }

    #[test]
    fn booleans_take_gflags_spellings_and_the_last_one_wins() {
        assert_eq!(args(&["--demo"]), vec!["--demo"]);
        assert_eq!(args(&["-demo=true"]), vec!["--demo"]);
        // False is said explicitly, so that it also wins over YADCC_DEMO.
        assert_eq!(args(&["--demo", "--nodemo"]), vec!["--demo=false"]);
        assert_eq!(args(&["--demo=false"]), vec!["--demo=false"]);
        assert_eq!(args(&["--nodemo", "--demo=yes"]), vec!["--demo"]);
        assert_eq!(
            args(&["--debugging-no-inspect-auth=1"]),
            vec!["--debugging_no_inspect_auth"]
        );
        let error = run(&["--demo=maybe"]).unwrap_err();
        assert!(error.contains("--demo=maybe"), "{error}");
    }

    #[test]
    fn framework_flags_are_dropped_with_a_warning() {
        let normalised = run(&[
            "--logtostderr",
            "--v=2",
            "--log_dir",
            "/var/log/yadcc",
            "-minloglevel",
            "1",
            "--nologtostderr",
            "--flare_concurrency_hint=8",
            "--port=1",
        ])
        .unwrap();
        let kept: Vec<_> = normalised.args.iter().skip(1).collect();
        assert_eq!(kept, vec!["--port=1"]);
        assert_eq!(normalised.warnings.len(), 6, "{:?}", normalised.warnings);
        assert!(normalised.warnings[0].contains("--logtostderr"));
        assert!(normalised.warnings[5].contains("flare"));
        assert!(
            normalised
                .warnings
                .iter()
                .all(|warning| warning.contains("no effect"))
        );
    }

    #[test]
    fn glogs_one_letter_verbosity_is_accepted_in_every_spelling() {
        for spelling in [&["-v=1"][..], &["--v=1"], &["-v", "1"], &["--v", "1"]] {
            let normalised = run(spelling).unwrap();
            assert_eq!(
                normalised.args.len(),
                1,
                "{spelling:?}: only the program name"
            );
            assert_eq!(normalised.warnings.len(), 1, "{spelling:?}");
            assert!(normalised.warnings[0].contains("--v "), "{spelling:?}");
        }
        // clap's own one-letter flags stay as they are.
        assert_eq!(args(&["-h"]), vec!["-h"]);
    }

    #[test]
    fn fromenv_reads_flags_in_place_and_later_flags_override() {
        assert_eq!(
            args(&[
                "--port=1",
                "--fromenv=port,demo",
                "--acceptable_user_tokens=c"
            ]),
            vec![
                "--port=1",
                "--port=9000",
                "--acceptable_user_tokens=c",
                "--demo"
            ]
        );
        assert_eq!(
            args(&["-fromenv", "acceptable_user_tokens", "--port=2"]),
            vec!["--acceptable_user_tokens=a,b", "--port=2"]
        );
        // A framework flag from the environment is ignored like one on the line.
        let glog = run(&["--fromenv=v"]).unwrap();
        assert_eq!((glog.args.len(), glog.warnings.len()), (1, 1));
        // A variable that is not set: an error for --fromenv only.
        let error = run(&["--fromenv=port,debugging_no_inspect_auth"]).unwrap_err();
        assert!(
            error.contains("FLAGS_debugging_no_inspect_auth not found in environment"),
            "{error}"
        );
        assert_eq!(
            args(&["--tryfromenv=debugging_no_inspect_auth,port"]),
            vec!["--port=9000"]
        );
        for (list, expected) in [
            ("port,,demo", "empty entry"),
            ("-port", "begins with '-'"),
            ("prot", "unknown command line flag 'prot'"),
            ("fromenv", "infinite recursion"),
        ] {
            let error = run(&[&format!("--fromenv={list}")]).unwrap_err();
            assert!(error.contains(expected), "{list}: {error}");
        }
        // A variable that lists itself again is stopped, not followed forever.
        let error = run(&["--tryfromenv=tryfromenv"]).unwrap_err();
        assert!(error.contains("--fromenv/--tryfromenv"), "{error}");
    }

    #[test]
    fn gflags_help_flags_show_the_usage() {
        assert_eq!(args(&["--helpfull"]), vec!["--help"]);
        assert_eq!(args(&["-helpshort"]), vec!["--help"]);
        assert_eq!(args(&["--helpfull=false", "--port=1"]), vec!["--port=1"]);
    }

    #[test]
    fn a_glog_switch_does_not_swallow_the_next_word() {
        // `--logtostderr` takes no value: `8336` stays for clap (which then
        // refuses it, as the original would ignore it).
        assert_eq!(args(&["--logtostderr", "8336"]), vec!["8336"]);
    }

    #[test]
    fn unknown_flags_pass_through_for_clap_to_refuse() {
        assert_eq!(args(&["-prot=1"]), vec!["--prot=1"]);
        // A flag without a value does not take the next word.
        assert_eq!(args(&["-help", "--demo"]), vec!["--help", "--demo"]);
    }

    #[test]
    fn everything_after_a_double_dash_is_left_alone() {
        assert_eq!(
            args(&["--demo", "--", "-demo"]),
            vec!["--demo", "--", "-demo"]
        );
    }

    #[test]
    fn flag_files_hold_one_flag_per_line_with_comments() {
        let flags = parse_flagfile(
            "# scheduler flags\n  --port=9000\r\n\n-acceptable_user_tokens=a, b \n#--demo\n",
        )
        .unwrap();
        // Values are literal: the trailing space is part of the token list.
        assert_eq!(flags, vec!["--port=9000", "-acceptable_user_tokens=a, b "]);
        let error = parse_flagfile("--port=1\nyadcc-scheduler\n").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
    }

    #[test]
    fn flag_files_expand_in_place_and_later_flags_override() {
        let dir = std::env::temp_dir().join(format!("yadcc-flagfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inner = dir.join("inner.flags");
        let outer = dir.join("outer.flags");
        std::fs::write(&inner, "--demo\n").unwrap();
        std::fs::write(
            &outer,
            format!("--port=1\n--flagfile={}\n--logtostderr\n", inner.display()),
        )
        .unwrap();
        let outer_flag = format!("-flagfile={}", outer.display());
        let normalised = run(&[&outer_flag, "--port=2"]).unwrap();
        let kept: Vec<_> = normalised.args.iter().skip(1).collect();
        assert_eq!(kept, vec!["--port=1", "--port=2", "--demo"]);
        assert_eq!(normalised.warnings.len(), 1);

        let looping = dir.join("loop.flags");
        std::fs::write(&looping, format!("--flagfile={}\n", looping.display())).unwrap();
        let error = run(&[&format!("--flagfile={}", looping.display())]).unwrap_err();
        assert!(error.contains("include itself"), "{error}");

        let missing = run(&["--flagfile", "/nonexistent/yadcc.flags"]).unwrap_err();
        assert!(missing.contains("/nonexistent/yadcc.flags"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
