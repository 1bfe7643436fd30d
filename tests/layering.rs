//! What the compiler cannot hold of ARCHITECTURE.md's layering, checked on the source tree. The
//! arrows between crates are the compiler's (`pulse-runtime` cannot name the app or a domain); these
//! rules are inside each crate, where every module may name every other: resolvers reach storage
//! only through services, and services know nothing of GraphQL. Comments are ignored; any other
//! mention of a forbidden crate or module (a `use`, a path in an expression) fails. Also an
//! assumption the request pipeline rests on: query complexity reads no argument but the page size
//! `first`.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The app's sources and every workspace crate's, the domain crates' among them.
fn sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    rust_files(&root.join("src"), &mut found);
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        rust_files(&entry.unwrap().path().join("src"), &mut found);
    }
    found
}

/// The identifiers of a file's code, comments left out.
fn identifiers(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .flat_map(|code| code.split(|c: char| !(c.is_alphanumeric() || c == '_')))
        .filter(|word| !word.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Files of `files` that mention one of `forbidden`, with the word found.
fn violations(files: &[PathBuf], forbidden: &[&str]) -> Vec<String> {
    files
        .iter()
        .flat_map(|path| {
            identifiers(path)
                .into_iter()
                .filter(|word| forbidden.contains(&word.as_str()))
                .map(move |word| format!("{} uses `{word}`", path.display()))
        })
        .collect()
}

fn named(files: &[PathBuf], names: &[&str]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|path| names.iter().any(|name| path.ends_with(name)))
        .cloned()
        .collect()
}

#[test]
fn resolvers_import_nothing_from_redis_sea_orm_or_the_db_module() {
    let files = sources();
    let mut resolvers = named(&files, &["graphql.rs"]);
    // The shared layer's `src/graphql/`, and a domain's resolvers split into `<domain>/graphql/`.
    resolvers.extend(
        files
            .iter()
            .filter(|path| path.parent().is_some_and(|dir| dir.ends_with("graphql")))
            .cloned(),
    );
    assert!(resolvers.len() >= 10, "found only {resolvers:?}");
    let found = violations(&resolvers, &["redis", "sea_orm", "db"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn services_import_nothing_from_the_graphql_layer() {
    let files = sources();
    // `src/services.rs` is not among them: it is the registration point, which lists each domain's
    // schema parts beside its services by design.
    let services = named(&files, &["service.rs", "actor.rs"])
        .into_iter()
        .filter(|path| {
            !path
                .parent()
                .is_some_and(|dir| dir.ends_with("src/graphql"))
        })
        .collect::<Vec<_>>();
    assert!(services.len() >= 6, "found only {services:?}");
    let found = violations(&services, &["graphql", "async_graphql"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// `pulse_edge::validated` reuses a document's validation verdict, complexity included, whenever its
/// variables are all `ID`s or `String`s: that is sound only while no complexity function reads an
/// argument of those types. Every `complexity = "…"` may name the children's complexity, the `Int`
/// page size `first`, and arithmetic on them.
#[test]
fn complexity_functions_read_only_the_page_size() {
    const ALLOWED: &[&str] = &[
        "child_complexity",
        "first",
        "connection_complexity",
        "unwrap_or",
        "clamp",
        "as",
        "usize",
    ];
    let mut found = 0;
    let mut violations = Vec::new();
    for path in sources() {
        let text = std::fs::read_to_string(&path).unwrap();
        for expression in text.split("complexity = \"").skip(1) {
            let expression = expression.split('"').next().unwrap_or_default();
            found += 1;
            for word in expression.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                let is_name = word.starts_with(|c: char| c.is_alphabetic() || c == '_');
                if is_name && !ALLOWED.contains(&word) {
                    violations.push(format!("{}: `{expression}` reads `{word}`", path.display()));
                }
            }
        }
    }
    assert!(
        found > 0,
        "no complexity functions found: the scan is broken"
    );
    assert!(violations.is_empty(), "{violations:#?}");
}
