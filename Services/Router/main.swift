print("frontdesk-router: not yet")
