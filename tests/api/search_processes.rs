//! Search served by real `pulse serve` processes: two of them on one database and one Redis
//! prefix, each with its own replica, agree after every kind of change; one SIGKILLed under load
//! leaves a replica that resumes to equal SQL.

use std::sync::Arc;
use std::time::Duration;

use pulse::entities::{articles, search_outbox};
use pulse::search::index::EmbeddedIndex;
use pulse::search::indexer::{Indexer, IndexerSettings, document};
use sea_orm::sea_query::{Expr, ExprTrait as _};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait};
use serde_json::{Value, json};

use crate::crash::{free_port, spawn_server_process};
use crate::helpers::{article_row, eventually, eventually_within, process_series, test_config};
use crate::search::{PUBLISH, SEARCH, applied};

/// One GraphQL call to a server process; `None` once the process is gone.
async fn call(
    http: &reqwest::Client,
    port: u16,
    token: Option<&str>,
    client_ip: &str,
    query: &str,
    variables: Value,
) -> Option<Value> {
    let mut request = http
        .post(format!("http://127.0.0.1:{port}/graphql"))
        .header("x-forwarded-for", client_ip)
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.ok()?.json().await.ok()
}

async fn sign_up_at(http: &reqwest::Client, port: u16, handle: &str) -> String {
    let response = call(
        http,
        port,
        None,
        "127.0.0.1",
        "mutation($h: String!, $p: String!) { signUp(handle: $h, password: $p) { token } }",
        json!({ "h": handle, "p": crate::helpers::PASSWORD }),
    )
    .await
    .unwrap();
    response["data"]["signUp"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{response}"))
        .to_owned()
}

#[tokio::test]
async fn a_server_killed_during_a_load_leaves_a_replica_that_resumes_to_equal_sql() {
    let config = test_config(|_| {}).await;
    let port = free_port();
    let mut server = spawn_server_process(
        &config,
        port,
        &[("PULSE_SEARCH_POLL", "10ms"), ("PULSE_SEARCH_BATCH", "50")],
    )
    .await;
    let http = reqwest::Client::new();
    let mut authors = Vec::new();
    let mut articles_by_author = Vec::new();
    for a in 0..4 {
        let token = sign_up_at(&http, port, &format!("author{a}")).await;
        let mut own = Vec::new();
        for i in 0..5 {
            let response = call(
                &http,
                port,
                Some(&token),
                "127.0.0.1",
                PUBLISH,
                json!({ "t": format!("loaded {a} {i}"), "b": "载入 load" }),
            )
            .await
            .unwrap();
            own.push(
                response["data"]["publishArticle"]["id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        authors.push(token);
        articles_by_author.push(own);
    }
    let mut readers = Vec::new();
    for r in 0..10 {
        readers.push(sign_up_at(&http, port, &format!("reader{r}")).await);
    }
    let all: Vec<String> = articles_by_author.concat();
    let (authors, readers, all, owned) = (
        Arc::new(authors),
        Arc::new(readers),
        Arc::new(all),
        Arc::new(articles_by_author),
    );
    // Two hundred clients view, edit, like and unlike until the server is gone.
    let clients: Vec<_> = (0..200usize)
        .map(|client| {
            let (http, authors, readers, all, owned) = (
                http.clone(),
                authors.clone(),
                readers.clone(),
                all.clone(),
                owned.clone(),
            );
            tokio::spawn(async move {
                for step in 0..2_000usize {
                    let article = &all[(client + step) % all.len()];
                    let ip = format!("10.{}.{}.{}", client % 250, step / 250, step % 250);
                    let done = match step % 4 {
                        0 | 1 => call(
                            &http,
                            port,
                            None,
                            &ip,
                            "mutation($a: ID!) { recordView(articleId: $a) { counted } }",
                            json!({ "a": article }),
                        )
                        .await,
                        2 => {
                            let author = client % authors.len();
                            call(
                                &http,
                                port,
                                Some(&authors[author]),
                                &ip,
                                "mutation($id: ID!, $t: String!) { editArticle(id: $id, input: { title: $t }) { id } }",
                                json!({
                                    "id": owned[author][step % owned[author].len()],
                                    "t": format!("edited {client} {step} 编辑"),
                                }),
                            )
                            .await
                        }
                        _ => {
                            let mutation = if step % 8 == 3 { "like" } else { "unlike" };
                            call(
                                &http,
                                port,
                                Some(&readers[client % readers.len()]),
                                &ip,
                                &format!("mutation($s: ID!) {{ {mutation}(subjectId: $s) {{ liked }} }}"),
                                json!({ "s": article }),
                            )
                            .await
                        }
                    };
                    if done.is_none() {
                        return;
                    }
                }
            })
        })
        .collect();
    let db = pulse::db::connect(&config.database_url(), Duration::from_secs(5))
        .await
        .unwrap();
    eventually(
        "the replica has applied a hundred rows of the load",
        async || process_series(&http, port, "pulse_search_rows_applied_total").await >= 120.0,
    )
    .await;
    server.kill().await.unwrap();
    for client in clients {
        client.await.unwrap();
    }

    let settings = IndexerSettings {
        poll: Duration::from_secs(3600),
        batch: 1000,
        gap_window: Duration::from_secs(60),
        retention: Duration::from_secs(86_400),
    };
    let index = EmbeddedIndex::open(&config.search_dir().join("replica-0")).unwrap();
    let indexer = Indexer::new(db.clone(), Arc::new(index.clone()), settings);
    let at_kill = applied(&indexer).await;
    let last = search_outbox::Entity::find()
        .order_by_desc(search_outbox::Column::Id)
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .id;
    assert!(
        at_kill.through < last,
        "the kill left outbox rows to apply ({} of {last})",
        at_kill.through
    );
    let mut resumed = 0;
    loop {
        let stepped = indexer.step().await.unwrap();
        assert!(!stepped.rebuilt, "the replica resumes, it is not rebuilt");
        if stepped.rows == 0 {
            break;
        }
        resumed += stepped.rows;
    }
    assert!(resumed > 0);
    let sql: Vec<_> = articles::Entity::find()
        .order_by_asc(articles::Column::Id)
        .all(&db)
        .await
        .unwrap()
        .iter()
        .map(document)
        .collect();
    assert_eq!(sql.len(), 20);
    assert_eq!(index.all_documents().unwrap(), sql);
    assert!(
        sql.iter().map(|doc| doc.view_count).sum::<i64>() > 0,
        "views were flushed"
    );

    let rebuild = crate::helpers::pulse_command()
        .args(["rebuild", "search"])
        .env("DATABASE_URL", config.database_url())
        .env("REDIS_URL", config.redis_url.as_deref().unwrap())
        .env(
            "PULSE_REDIS_PREFIX",
            config.redis_prefix.as_deref().unwrap(),
        )
        .env("PULSE_DATA_DIR", &config.data_dir)
        .output()
        .await
        .unwrap();
    assert!(rebuild.status.success(), "{rebuild:?}");
    assert!(
        indexer.step().await.unwrap().rebuilt,
        "pulse rebuild search reaches the replica"
    );
    assert_eq!(index.all_documents().unwrap(), sql);
}

/// Counts change and nothing else while the server is SIGKILLed: the replica reopens without
/// counts, loads them from SQL and resumes to equal SQL without rewriting a document.
#[tokio::test]
async fn a_server_killed_during_a_count_stream_leaves_a_replica_that_resumes_to_equal_sql() {
    let config = test_config(|_| {}).await;
    let port = free_port();
    let mut server = spawn_server_process(
        &config,
        port,
        &[("PULSE_SEARCH_POLL", "10ms"), ("PULSE_SEARCH_BATCH", "20")],
    )
    .await;
    let http = reqwest::Client::new();
    let author = sign_up_at(&http, port, "counted").await;
    let mut all = Vec::new();
    for i in 0..10 {
        all.push(publish_at(&http, port, &author, &format!("counted {i}"), "计数 count").await);
    }
    let mut readers = Vec::new();
    for r in 0..10 {
        readers.push(sign_up_at(&http, port, &format!("counter{r}")).await);
    }
    eventually("the replica has every article", async || {
        let response = call(
            &http,
            port,
            None,
            "127.0.0.1",
            SEARCH,
            json!({ "q": "counted", "first": 20 }),
        )
        .await
        .unwrap();
        response["data"]["searchArticles"]["edges"]
            .as_array()
            .is_some_and(|edges| edges.len() == 10)
    })
    .await;
    let applied_before = process_series(&http, port, "pulse_search_rows_applied_total").await;
    let (readers, all) = (Arc::new(readers), Arc::new(all));
    let clients: Vec<_> = (0..100usize)
        .map(|client| {
            let (http, readers, all) = (http.clone(), readers.clone(), all.clone());
            tokio::spawn(async move {
                for step in 0..2_000usize {
                    let article = &all[(client + step) % all.len()];
                    let ip = format!("10.{}.{}.{}", client % 250, step / 250, step % 250);
                    let done = if step % 3 == 2 {
                        let mutation = if step % 6 == 2 { "like" } else { "unlike" };
                        call(
                            &http,
                            port,
                            Some(&readers[client % readers.len()]),
                            &ip,
                            &format!(
                                "mutation($s: ID!) {{ {mutation}(subjectId: $s) {{ liked }} }}"
                            ),
                            json!({ "s": article }),
                        )
                        .await
                    } else {
                        call(
                            &http,
                            port,
                            None,
                            &ip,
                            "mutation($a: ID!) { recordView(articleId: $a) { counted } }",
                            json!({ "a": article }),
                        )
                        .await
                    };
                    if done.is_none() {
                        return;
                    }
                }
            })
        })
        .collect();
    // Killed once rows flow, while the clients' 200,000 mutations still run. On a slow CI machine
    // running the whole suite at once, a hundred rows took more than 30 s to be applied on three
    // backends of four; twenty within two minutes still puts the kill mid-stream.
    eventually_within(
        Duration::from_secs(120),
        "the replica has applied twenty count rows",
        async || {
            process_series(&http, port, "pulse_search_rows_applied_total").await
                >= applied_before + 20.0
        },
    )
    .await;
    server.kill().await.unwrap();
    for client in clients {
        client.await.unwrap();
    }

    let db = pulse::db::connect(&config.database_url(), Duration::from_secs(5))
        .await
        .unwrap();
    let settings = IndexerSettings {
        poll: Duration::from_secs(3600),
        batch: 1000,
        gap_window: Duration::from_secs(60),
        retention: Duration::from_secs(86_400),
    };
    // The indexer keeps up with this stream, so the kill may find nothing left to apply: counts
    // also change while the server is down, as a flush by another process would.
    let txn = db.begin().await.unwrap();
    let ids: Vec<i64> = all.iter().map(|id| article_row(id)).collect();
    articles::Entity::update_many()
        .col_expr(
            articles::Column::ViewCount,
            Expr::col(articles::Column::ViewCount).add(1),
        )
        .filter(articles::Column::Id.is_in(ids.iter().copied()))
        .exec(&txn)
        .await
        .unwrap();
    pulse::search::outbox::record(&txn, ids).await.unwrap();
    txn.commit().await.unwrap();
    let index = EmbeddedIndex::open(&config.search_dir().join("replica-0")).unwrap();
    let indexer = Indexer::new(db.clone(), Arc::new(index.clone()), settings);
    let at_kill = applied(&indexer).await;
    let last = search_outbox::Entity::find()
        .order_by_desc(search_outbox::Column::Id)
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .id;
    assert!(at_kill.through < last);
    loop {
        let stepped = indexer.step().await.unwrap();
        assert!(!stepped.rebuilt, "the replica resumes, it is not rebuilt");
        if stepped.rows == 0 {
            break;
        }
    }
    let sql: Vec<_> = articles::Entity::find()
        .order_by_asc(articles::Column::Id)
        .all(&db)
        .await
        .unwrap()
        .iter()
        .map(document)
        .collect();
    assert_eq!(index.all_documents().unwrap(), sql);
    assert_eq!(
        index.documents_written(),
        0,
        "the resume rewrote no document: only counts changed"
    );
    assert!(
        sql.iter().map(|doc| doc.view_count).sum::<i64>() > 0,
        "views were flushed"
    );
}

async fn publish_at(
    http: &reqwest::Client,
    port: u16,
    token: &str,
    title: &str,
    body: &str,
) -> String {
    let response = call(
        http,
        port,
        Some(token),
        "127.0.0.1",
        PUBLISH,
        json!({ "t": title, "b": body }),
    )
    .await
    .unwrap();
    response["data"]["publishArticle"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("publish failed: {response}"))
        .to_owned()
}

/// The `searchArticles` calls (query, sort) the two servers must answer alike.
const PROBES: [(&str, &str); 8] = [
    ("twin", "RELEVANCE"),
    ("twin", "VIEWS"),
    ("twin", "LIKES"),
    ("twin", "NEWEST"),
    ("浏览量", "RELEVANCE"),
    ("epsilon", "RELEVANCE"),
    ("delta", "RELEVANCE"),
    ("gamma", "RELEVANCE"),
];

/// A server's answer to every probe: each hit's fields but its cursor (which names a snapshot of
/// the replica that issued it, so it differs between servers by design), and the number of hits.
async fn answers(http: &reqwest::Client, port: u16) -> Vec<Value> {
    let mut answers = Vec::new();
    for (query, sort) in PROBES {
        let variables = json!({ "q": query, "sort": sort });
        let response = call(http, port, None, "127.0.0.1", SEARCH, variables)
            .await
            .expect("the server answers");
        let Some(edges) = response["data"]["searchArticles"]["edges"].as_array() else {
            answers.push(response);
            continue;
        };
        let hits: Vec<Value> = edges
            .iter()
            .map(|edge| {
                let mut hit = edge.clone();
                hit.as_object_mut().unwrap().remove("cursor");
                hit
            })
            .collect();
        answers.push(json!({
            "query": query,
            "sort": sort,
            "count": hits.len(),
            "hits": hits,
        }));
    }
    answers
}

fn hit_ids(answer: &Value) -> Vec<String> {
    answer["hits"]
        .as_array()
        .map(|hits| {
            hits.iter()
                .map(|hit| hit["node"]["id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// (id, viewCount, likeCount) of every hit.
fn hit_counts(answer: &Value) -> Vec<(String, i64, i64)> {
    answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| {
            let node = &hit["node"];
            (
                node["id"].as_str().unwrap().to_owned(),
                node["viewCount"].as_i64().unwrap(),
                node["likeCount"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn two_server_processes_answer_search_alike_from_their_own_replicas_after_every_kind_of_change()
 {
    // One data dir for both, as two processes started with the same defaults on one host would
    // have: each takes its own replica in it.
    let config = test_config(|_| {}).await;
    let settings = [("PULSE_SEARCH_POLL", "50ms")];
    let (writer, reader) = (free_port(), free_port());
    let _writing = spawn_server_process(&config, writer, &settings).await;
    let _reading = spawn_server_process(&config, reader, &settings).await;
    for replica in ["replica-0", "replica-1"] {
        assert!(
            config.search_dir().join(replica).is_dir(),
            "each process holds a replica of its own: {replica}"
        );
    }
    let http = reqwest::Client::new();
    let author = sign_up_at(&http, writer, "twin_author").await;
    let alpha = publish_at(
        &http,
        writer,
        &author,
        "twin alpha 浏览量计数",
        "first of the twins 高并发",
    )
    .await;
    let beta = publish_at(&http, writer, &author, "twin beta", "second of the twins").await;
    let gamma = publish_at(&http, writer, &author, "twin gamma", "third of the twins").await;
    let delta = publish_at(&http, writer, &author, "twin delta", "fourth of the twins").await;
    for port in [writer, reader] {
        eventually(
            "each server finds the four published articles",
            async || {
                let mut ids = hit_ids(&answers(&http, port).await[0]);
                ids.sort();
                let mut published = vec![alpha.clone(), beta.clone(), gamma.clone(), delta.clone()];
                published.sort();
                ids == published
            },
        )
        .await;
    }

    let edited = call(
        &http,
        writer,
        Some(&author),
        "127.0.0.1",
        "mutation($id: ID!) { editArticle(id: $id, input: { title: \"twin epsilon\" }) { id } }",
        json!({ "id": delta }),
    )
    .await
    .unwrap();
    assert!(edited["data"]["editArticle"].is_object(), "{edited}");
    for (article, viewers) in [(&beta, 3), (&alpha, 1)] {
        for viewer in 0..viewers {
            let response = call(
                &http,
                writer,
                None,
                &format!("10.4.0.{viewer}"),
                "mutation($a: ID!) { recordView(articleId: $a) { counted } }",
                json!({ "a": article }),
            )
            .await
            .unwrap();
            assert_eq!(
                response["data"]["recordView"]["counted"], true,
                "{response}"
            );
        }
    }
    for (article, likers) in [(&alpha, 2), (&delta, 1)] {
        for liker in 0..likers {
            let token = sign_up_at(&http, writer, &format!("twin_fan_{liker}_{likers}")).await;
            let response = call(
                &http,
                writer,
                Some(&token),
                "127.0.0.1",
                "mutation($s: ID!) { like(subjectId: $s) { liked } }",
                json!({ "s": article }),
            )
            .await
            .unwrap();
            assert_eq!(response["data"]["like"]["liked"], true, "{response}");
        }
    }
    // The API deletes no article; SQL does (a deleted author's articles go with it), and the
    // deletion's outbox row is written in its transaction like any other change's.
    let db = pulse::db::connect(&config.database_url(), Duration::from_secs(5))
        .await
        .unwrap();
    let txn = db.begin().await.unwrap();
    articles::Entity::delete_many()
        .filter(articles::Column::Id.eq(article_row(&gamma)))
        .exec(&txn)
        .await
        .unwrap();
    pulse::search::outbox::record(&txn, [article_row(&gamma)])
        .await
        .unwrap();
    txn.commit().await.unwrap();

    // Views flushed and likes archived by either process, each replica following the outbox.
    // The hits expected for each of PROBES.
    let expected: [Vec<&String>; 8] = [
        vec![&delta, &beta, &alpha],
        vec![&beta, &alpha, &delta],
        vec![&alpha, &delta, &beta],
        vec![&delta, &beta, &alpha],
        vec![&alpha],
        vec![&delta],
        vec![],
        vec![],
    ];
    // Relevance: "twin" once in every title and body, so the shorter documents lead, and the
    // two equally long ones tie and go by id, newest first.
    let settled = async |port: u16| -> bool {
        let answers = answers(&http, port).await;
        answers
            .iter()
            .zip(&expected)
            .all(|(answer, ids)| hit_ids(answer).iter().eq(ids.iter().copied()))
    };
    eventually("both replicas have applied every change", async || {
        settled(writer).await && settled(reader).await
    })
    .await;
    let (written, read) = (answers(&http, writer).await, answers(&http, reader).await);
    for (at_writer, at_reader) in written.iter().zip(&read) {
        assert_eq!(
            at_writer, at_reader,
            "both servers answer alike, field by field"
        );
    }
    assert_eq!(
        hit_counts(&written[1]),
        [
            (beta.clone(), 3, 0),
            (alpha.clone(), 1, 2),
            (delta.clone(), 0, 1)
        ],
        "views then likes, as SQL holds them"
    );
    assert_eq!(written[5]["hits"][0]["node"]["title"], "twin epsilon");
    assert!(
        written[4]["hits"][0]["highlightedTitle"]
            .as_str()
            .unwrap()
            .contains("<b>浏览量</b>"),
        "{}",
        written[4]
    );
}
