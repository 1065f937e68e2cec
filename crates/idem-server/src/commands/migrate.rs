//! `idem migrate`: applies the migrations and exits.

use super::DbArgs;
use crate::backend::Db;

/// `idem migrate`.
pub async fn run(db: DbArgs) -> anyhow::Result<()> {
    Db::open(&db.database_url).await?;
    println!("migrations applied");
    Ok(())
}
