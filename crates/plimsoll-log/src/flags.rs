//! Go-style single-dash long flags (`-set FILE`, `-known=FILE`), which the seed's Go tools
//! take and scripts written for them pass: every binary that promises them rewrites its
//! arguments with [`go_style_flags`] before clap parses them.

/// Rewrites single-dash long flags to their `--long` forms for every long flag `cmd` (or
/// one of its subcommands) knows, up to a `--`. Short flags (`-x`), unknown names and
/// arguments after `--` are left as they are.
pub fn go_style_flags(cmd: &clap::Command, args: Vec<String>) -> Vec<String> {
    let mut longs: Vec<String> = vec!["help".to_owned(), "version".to_owned()];
    let mut collect = |c: &clap::Command| {
        longs.extend(
            c.get_arguments()
                .filter_map(|a| a.get_long().map(str::to_owned)),
        );
    };
    collect(cmd);
    for sub in cmd.get_subcommands() {
        collect(sub);
    }
    let mut out = Vec::with_capacity(args.len());
    let mut rest = false;
    for (i, a) in args.into_iter().enumerate() {
        if i == 0 || rest {
            out.push(a);
            continue;
        }
        if a == "--" {
            rest = true;
            out.push(a);
            continue;
        }
        if let Some(body) = a.strip_prefix('-').filter(|b| !b.starts_with('-')) {
            let name = body.split_once('=').map_or(body, |(n, _)| n);
            if name.len() > 1 && longs.iter().any(|l| l == name) {
                out.push(format!("-{a}"));
                continue;
            }
        }
        out.push(a);
    }
    out
}
