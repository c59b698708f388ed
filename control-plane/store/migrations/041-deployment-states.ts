// The operator's drain or disable of one deployment of a pooled model (`tollgate models drain|disable`):
// no row, the deployment is enabled. Kept by model and deployment id across config reloads; a row whose
// deployment the config no longer lists is kept and applies again if it comes back.
export const sql = `
CREATE TABLE deployment_states (
  model TEXT NOT NULL,
  deployment TEXT NOT NULL,
  state TEXT NOT NULL,
  changed_at TEXT NOT NULL,
  PRIMARY KEY (model, deployment)
);
`;
