from jaxsim.cli.main import main

main()
