//! Crawler (bot) User-Agent detection, so article views from bots are not counted.
//!
//! The patterns are the `crawler-user-agents` npm package (MIT, Martin Monperrus and
//! contributors), shipped unmodified as `crawler-user-agents.json` next to this file, with
//! its licence in `CRAWLER-USER-AGENTS-LICENSE`. As upstream, they are case-sensitive regexes.
//!
//! Deployment-specific bots: pass extra regexes to [`CrawlerDetector::new`] (the config hook);
//! prefix them with `(?i)` to match case-insensitively.
//!
//! Refresh the list: `npm pack crawler-user-agents && tar xzf crawler-user-agents-*.tgz`, copy
//! `package/crawler-user-agents.json` here and update the version line of the licence file.

use std::fmt;

use anyhow::Context as _;
use regex::RegexSet;
use serde::Deserialize;

/// Upstream list: a JSON array of objects with a `pattern` field (other fields unused).
const SHIPPED_PATTERNS_JSON: &str = include_str!("crawler-user-agents.json");

/// User-Agents are matched on their first this many bytes only, to bound CPU per request.
const MAX_USER_AGENT_BYTES: usize = 512;

#[derive(Deserialize)]
struct Entry {
    pattern: String,
}

/// Decides whether a User-Agent belongs to a crawler. Build once and share it.
#[derive(Clone)]
pub struct CrawlerDetector {
    set: RegexSet,
}

impl CrawlerDetector {
    /// Compiles the shipped patterns plus `extra_patterns`; an invalid extra pattern is an
    /// error naming it.
    pub fn new(extra_patterns: &[String]) -> anyhow::Result<Self> {
        for pattern in extra_patterns {
            regex::Regex::new(pattern)
                .with_context(|| format!("invalid extra crawler pattern {pattern:?}"))?;
        }
        let shipped: Vec<Entry> = serde_json::from_str(SHIPPED_PATTERNS_JSON)
            .context("parsing the shipped crawler-user-agents.json")?;
        let patterns = shipped
            .iter()
            .map(|entry| entry.pattern.as_str())
            .chain(extra_patterns.iter().map(String::as_str));
        // Case-sensitive, as upstream; the compiled set (~0.6 MiB) fits the default size limit.
        let set = RegexSet::new(patterns).context("compiling the crawler User-Agent patterns")?;
        Ok(Self { set })
    }

    /// Whether `user_agent` matches any crawler pattern.
    ///
    /// A missing or empty User-Agent is *not* a crawler: API clients and privacy tools
    /// often omit it, and those are real readers. Only the first 512 bytes are matched.
    pub fn is_crawler(&self, user_agent: Option<&str>) -> bool {
        let Some(user_agent) = user_agent.filter(|ua| !ua.is_empty()) else {
            return false;
        };
        let user_agent = &user_agent[..user_agent.floor_char_boundary(MAX_USER_AGENT_BYTES)];
        self.set.is_match(user_agent)
    }
}

impl fmt::Debug for CrawlerDetector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrawlerDetector")
            .field("patterns", &self.set.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
    const SAFARI: &str = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15";
    const MOBILE_SAFARI: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1";

    fn detector() -> CrawlerDetector {
        CrawlerDetector::new(&[]).expect("shipped patterns compile")
    }

    fn is_crawler(ua: &str) -> bool {
        detector().is_crawler(Some(ua))
    }

    #[test]
    fn googlebot_is_a_crawler() {
        assert!(is_crawler(
            "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
        ));
    }

    #[test]
    fn bingbot_is_a_crawler() {
        assert!(is_crawler(
            "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"
        ));
    }

    #[test]
    fn baiduspider_is_a_crawler() {
        assert!(is_crawler(
            "Mozilla/5.0 (compatible; Baiduspider/2.0; +http://www.baidu.com/search/spider.html)"
        ));
    }

    #[test]
    fn ahrefsbot_is_a_crawler() {
        assert!(is_crawler(
            "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)"
        ));
    }

    #[test]
    fn curl_is_a_crawler_because_upstream_lists_it() {
        // Upstream pattern: "^curl".
        assert!(is_crawler("curl/8.5.0"));
    }

    #[test]
    fn python_requests_is_a_crawler_because_upstream_lists_it() {
        // Upstream pattern: "python-requests".
        assert!(is_crawler("python-requests/2.32.3"));
    }

    #[test]
    fn matching_is_case_sensitive_like_upstream() {
        assert!(!is_crawler("PYTHON-REQUESTS/2.32.3"));
    }

    #[test]
    fn desktop_chrome_firefox_and_safari_are_not_crawlers() {
        for ua in [CHROME, FIREFOX, SAFARI] {
            assert!(!is_crawler(ua), "{ua}");
        }
    }

    #[test]
    fn mobile_safari_is_not_a_crawler() {
        assert!(!is_crawler(MOBILE_SAFARI));
    }

    #[test]
    fn missing_or_empty_user_agent_is_not_a_crawler() {
        let detector = detector();
        assert!(!detector.is_crawler(None));
        assert!(!detector.is_crawler(Some("")));
    }

    #[test]
    fn only_the_first_512_bytes_are_matched() {
        let padding = "x".repeat(MAX_USER_AGENT_BYTES);
        assert!(!is_crawler(&format!("{padding}Googlebot/2.1")));
        assert!(is_crawler(&format!("Googlebot/2.1 {padding}")));
    }

    #[test]
    fn truncation_keeps_or_drops_a_straddling_character_whole() {
        // 'é' is two bytes. Ending at byte 512 it is inside the inspected part; straddling the
        // cut it is dropped whole (slicing inside it would panic).
        let detector = CrawlerDetector::new(&["xé".to_owned()]).unwrap();
        let inside = format!(
            "{}é{}",
            "x".repeat(MAX_USER_AGENT_BYTES - 2),
            "y".repeat(100)
        );
        assert!(detector.is_crawler(Some(&inside)));
        let straddling = format!(
            "{}é{}",
            "x".repeat(MAX_USER_AGENT_BYTES - 1),
            "y".repeat(100)
        );
        assert!(!detector.is_crawler(Some(&straddling)));
    }

    #[test]
    fn an_extra_pattern_is_honoured() {
        let detector = CrawlerDetector::new(&["(?i)acme-monitor".to_owned()]).unwrap();
        assert!(detector.is_crawler(Some("ACME-Monitor/1.0 (+https://acme.example)")));
        assert!(!detector.is_crawler(Some(CHROME)));
    }

    #[test]
    fn an_invalid_extra_pattern_is_an_error_naming_it() {
        let err = CrawlerDetector::new(&["acme-(monitor".to_owned()]).unwrap_err();
        assert!(format!("{err:#}").contains("acme-(monitor"), "{err:#}");
    }

    #[test]
    fn the_shipped_list_has_more_than_100_patterns_and_all_compile() {
        let entries: Vec<Entry> = serde_json::from_str(SHIPPED_PATTERNS_JSON).unwrap();
        assert!(entries.len() > 100, "only {} patterns", entries.len());
        for entry in &entries {
            regex::Regex::new(&entry.pattern)
                .unwrap_or_else(|e| panic!("pattern {:?} does not compile: {e}", entry.pattern));
        }
        assert_eq!(detector().set.len(), entries.len());
    }
}
