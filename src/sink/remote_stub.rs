//! Temporary stand-in until the remote sink lands.
use std::time::Duration;
pub struct RemoteStatement {
    pub sql: String,
    pub params: Vec<Option<String>>,
}
#[derive(Debug, Clone)]
pub struct RemoteError {
    pub message: String,
    pub sqlstate: Option<String>,
    pub hint: Option<String>,
    pub transient: bool,
}
pub struct RemoteSink;
impl RemoteSink {
    pub fn start(_c: String, _a: &str) -> RemoteSink {
        RemoteSink
    }
    pub fn transaction(
        &self,
        _s: Vec<RemoteStatement>,
        _t: Duration,
    ) -> Result<Vec<Vec<Vec<Option<String>>>>, RemoteError> {
        Err(self.e())
    }
    pub fn query(
        &self,
        _s: &str,
        _p: Vec<Option<String>>,
        _t: Duration,
    ) -> Result<Vec<Vec<Option<String>>>, RemoteError> {
        Err(self.e())
    }
    fn e(&self) -> RemoteError {
        RemoteError {
            message: "not built".into(),
            sqlstate: None,
            hint: None,
            transient: true,
        }
    }
}
pub fn conninfo_from_options(_o: &[(String, String)]) -> String {
    String::new()
}
