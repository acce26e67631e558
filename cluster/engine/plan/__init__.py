"""The sweep's time budget: what each study still needs once its search stops, from the costs this
run measured (``budget.TimePlan``)."""
