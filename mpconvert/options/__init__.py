"""The options of every command, frozen dataclasses, one module per concept; no framework is imported here.

Each option is declared once, as a field with `keywords.keyword(...)`: its
API keyword, manifest key, CLI flag, help, range and default, and whether
it can change a result (the batch cache key). By concept:

- keywords: the declaration machinery (`keyword`, `table`, `build`,
  `keywords_of`, `check_ranges`, `key_fields`)
- precision: what each policy means (`Precision`); artifact_kinds: the
  files a conversion writes, by name
- load, rewrite (and the automatic keep), validate, finetune, pad: each
  conversion stage's options
- gate: the thresholds as given (`GateOptions`) and as judged by
  (`Thresholds`, report.json's gate.thresholds), with their defaults
- export: which artifacts are written and where (`ExportOptions`,
  `SaveOptions`)
- convert: a conversion's one options object (`ConvertOptions`), the
  speed stage's options, the batch cache key, and the table of every
  conversion keyword
- tracking, verify, batch: MLflow's, `mpconvert verify`'s and
  `mpconvert batch`'s own options
"""
