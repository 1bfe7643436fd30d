//! Per-request DataLoaders. Each is made on first use, so a request that needs none (most mutations)
//! pays for none; within a request, every load of one kind is batched.

use std::sync::{Arc, OnceLock};

use async_graphql::dataloader::DataLoader;

use crate::accounts::loader::UserLoader;
use crate::articles::loader::ArticleLoader;
use crate::services::Services;
use crate::views::loader::ViewCountLoader;

pub struct Loaders {
    services: Arc<Services>,
    users: OnceLock<DataLoader<UserLoader>>,
    articles: OnceLock<DataLoader<ArticleLoader>>,
    view_counts: OnceLock<DataLoader<ViewCountLoader>>,
}

impl Loaders {
    pub fn new(services: Arc<Services>) -> Self {
        Self {
            services,
            users: OnceLock::new(),
            articles: OnceLock::new(),
            view_counts: OnceLock::new(),
        }
    }

    pub fn users(&self) -> &DataLoader<UserLoader> {
        self.users.get_or_init(|| {
            DataLoader::new(UserLoader(self.services.accounts.clone()), tokio::spawn)
        })
    }

    pub fn articles(&self) -> &DataLoader<ArticleLoader> {
        self.articles.get_or_init(|| {
            DataLoader::new(ArticleLoader(self.services.articles.clone()), tokio::spawn)
        })
    }

    pub fn view_counts(&self) -> &DataLoader<ViewCountLoader> {
        self.view_counts.get_or_init(|| {
            DataLoader::new(ViewCountLoader(self.services.views.clone()), tokio::spawn)
        })
    }
}
