//! The README's configuration table, `.env.example` and `pulse --help` describe the same settings:
//! each variable with its flag and, where `--help` states one, its default. A setting added to the
//! code and not to the docs (or left in the docs after it went) fails here.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use regex::Regex;

/// One setting as a document states it.
#[derive(Debug, PartialEq, Eq)]
struct Setting {
    flag: String,
    default: Option<String>,
}

/// Every setting `pulse --help` lists, by variable: its flag and its `[default: …]`.
fn from_help() -> BTreeMap<String, Setting> {
    let output = Command::new(env!("CARGO_BIN_EXE_pulse"))
        .arg("--help")
        .env_clear()
        .output()
        .expect("pulse --help runs");
    assert!(output.status.success(), "pulse --help failed");
    let help = String::from_utf8(output.stdout).expect("the help is UTF-8");
    let option = Regex::new(r"^\s+(?:-\w, )?--([a-z0-9-]+)").unwrap();
    // A secret's value is hidden: `[env: PULSE_TOKEN_SECRET]`, without `=`.
    let env = Regex::new(r"\[env: ([A-Z0-9_]+)(?:=[^\]]*)?\]").unwrap();
    let default = Regex::new(r"\[default: ([^\]]*)\]").unwrap();
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        match option.captures(line) {
            Some(flag) => blocks.push((format!("--{}", &flag[1]), String::new())),
            None => {
                if let Some((_, text)) = blocks.last_mut() {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
    }
    let settings: BTreeMap<String, Setting> = blocks
        .into_iter()
        .filter_map(|(flag, text)| {
            let variable = env.captures(&text)?[1].to_owned();
            let default = default.captures(&text).map(|found| found[1].to_owned());
            Some((variable, Setting { flag, default }))
        })
        .collect();
    assert!(
        settings.len() > 40,
        "too few settings parsed from --help: {settings:?}"
    );
    settings
}

fn repository_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The README's "Configuration" table, by variable: its flag and the first code span of its
/// default cell (the value; prose such as "unset" names none). Rows without a flag (`RUST_LOG`)
/// are read by libraries, not by Pulse's command line, and are left out.
fn from_readme() -> BTreeMap<String, Setting> {
    let readme = repository_file("README.md");
    let section = readme
        .split("\n## Configuration\n")
        .nth(1)
        .expect("the README has a Configuration section");
    let section = section.split("\n## ").next().unwrap();
    let code = Regex::new(r"`([^`]*)`").unwrap();
    let mut settings = BTreeMap::new();
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let span = |cell: &str| code.captures(cell).map(|found| found[1].to_owned());
        let variable = span(cells[1]).expect("a variable in the first cell");
        let Some(flag) = span(cells[2]) else {
            continue;
        };
        let previous = settings.insert(
            variable.clone(),
            Setting {
                flag,
                default: span(cells[3]),
            },
        );
        assert!(previous.is_none(), "{variable} has two rows");
    }
    settings
}

#[test]
fn the_readme_configuration_table_and_pulse_help_agree() {
    let help = from_help();
    let readme = from_readme();
    let mut differences = Vec::new();
    for (variable, setting) in &help {
        match readme.get(variable) {
            None => differences.push(format!("{variable} ({}) has no README row", setting.flag)),
            Some(row) => {
                if row.flag != setting.flag {
                    differences.push(format!(
                        "{variable}: README flag {}, --help {}",
                        row.flag, setting.flag
                    ));
                }
                if setting.default.is_some() && row.default != setting.default {
                    differences.push(format!(
                        "{variable}: README default {:?}, --help {:?}",
                        row.default, setting.default
                    ));
                }
            }
        }
    }
    for variable in readme
        .keys()
        .filter(|variable| !help.contains_key(*variable))
    {
        differences.push(format!("{variable} is in the README but not in --help"));
    }
    assert!(differences.is_empty(), "{differences:#?}");
}

#[test]
fn env_example_lists_every_setting_of_pulse_help() {
    let help = from_help();
    let example = repository_file(".env.example");
    // What follows this line configures the test suite, not `pulse`.
    let example = example
        .split("# --- used by the test suite")
        .next()
        .unwrap();
    let line = Regex::new(r"^#? ?([A-Z][A-Z0-9_]+)=(.*)$").unwrap();
    let mut listed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for found in example.lines().filter_map(|text| line.captures(text)) {
        listed
            .entry(found[1].to_owned())
            .or_default()
            .push(found[2].to_owned());
    }
    let mut differences = Vec::new();
    for (variable, setting) in &help {
        match (listed.get(variable), &setting.default) {
            (None, _) => differences.push(format!("{variable} is not in .env.example")),
            (Some(values), Some(default)) if !values.contains(default) => differences.push(
                format!("{variable}: .env.example has {values:?}, the default is {default:?}"),
            ),
            _ => {}
        }
    }
    for variable in listed
        .keys()
        .filter(|variable| !help.contains_key(*variable))
    {
        if variable != "RUST_LOG" {
            differences.push(format!("{variable} is in .env.example but not in --help"));
        }
    }
    assert!(differences.is_empty(), "{differences:#?}");
}
