"""The fleet report run in W&B, published after each snapshot when WANDB_ASSETS_REPORT_PROJECT is set."""
