"""prefzoo inside other trainers: ``prefzoo.integrations.trl.DPOTrainer`` (TRL).  Nothing is imported here."""
